package testenv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"syscall"
	"testing"
	"time"
)

// TestSchemaRegistryRestart registers a schema, stops the registry, sees
// the connection refused, starts it again and finds the schema under the
// same id: what a test of an outage of the registry relies on.
func TestSchemaRegistryRestart(t *testing.T) {
	r := StartSchemaRegistry(t)
	client := &http.Client{Timeout: 10 * time.Second}
	const schema = `{"type":"record","name":"R","fields":[{"name":"a","type":"long"}]}`
	id := registerSchema(t, client, r.URL, "s-value", schema)
	checkSchema(t, client, r.URL, id, schema)

	r.Stop(t)
	_, err := client.Get(fmt.Sprintf("%s/schemas/ids/%d", r.URL, id))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("GET from a stopped registry: %v, want connection refused", err)
	}

	r.Start(t)
	checkSchema(t, client, r.URL, id, schema)
	// The same schema again is the same id, and a new one a new id: the
	// ids are the stored ones, not a fresh count.
	if again := registerSchema(t, client, r.URL, "s-value", schema); again != id {
		t.Fatalf("the schema registered again after the restart has id %d, want %d", again, id)
	}
	other := registerSchema(t, client, r.URL, "t-value", `{"type":"record","name":"Q","fields":[{"name":"b","type":"string"}]}`)
	if other == id {
		t.Fatalf("a new schema after the restart got the id %d of the old one", id)
	}
}

func registerSchema(t *testing.T, client *http.Client, url, subject, schema string) int {
	t.Helper()
	body, err := json.Marshal(map[string]string{"schema": schema})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Post(url+"/subjects/"+subject+"/versions", "application/vnd.schemaregistry.v1+json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	defer resp.Body.Close()
	var got struct {
		ID int `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK || got.ID <= 0 {
		t.Fatalf("register %s: %s, id %d, %v", subject, resp.Status, got.ID, err)
	}
	return got.ID
}

func checkSchema(t *testing.T, client *http.Client, url string, id int, want string) {
	t.Helper()
	resp, err := client.Get(fmt.Sprintf("%s/schemas/ids/%d", url, id))
	if err != nil {
		t.Fatalf("get schema %d: %v", id, err)
	}
	defer resp.Body.Close()
	var got struct {
		Schema string `json:"schema"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("get schema %d: %s, %v", id, resp.Status, err)
	}
	var g, w any
	if err := json.Unmarshal([]byte(got.Schema), &g); err != nil {
		t.Fatalf("schema %d is not JSON: %v: %q", id, err, got.Schema)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("schema %d is %s, want %s", id, got.Schema, want)
	}
}
