package validate

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

// grafanaVars replaces the dashboard's variables with values PromQL parses.
var grafanaVars = []struct{ re, with string }{
	{`\$__rate_interval|\$\{__rate_interval\}`, "5m"},
	{`\$__interval|\$\{__interval\}`, "1m"},
	{`\$__range|\$\{__range\}`, "1h"},
	{`\$pipeline|\$\{pipeline(:[a-z]+)?\}`, ".*"},
}

func substituteVars(expr string) (string, error) {
	for _, v := range grafanaVars {
		expr = regexp.MustCompile(v.re).ReplaceAllString(expr, v.with)
	}
	if m := regexp.MustCompile(`\$\{?\w+`).FindString(expr); m != "" {
		return "", fmt.Errorf("unknown dashboard variable %s", m)
	}
	return expr, nil
}

const wantDatasource = `{"type":"prometheus","uid":"${datasource}"}`

func compactJSON(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// TestDashboard: deploy/grafana/dashboard.json is a dashboard whose every
// panel queries the datasource variable with at least one PromQL target,
// and every expression selects metrics idemstream registers.
func TestDashboard(t *testing.T) {
	raw := readFile(t, deployPath("grafana", "dashboard.json"))
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard.json: uid and title are required for provisioning")
	}
	if d.SchemaVersion < 36 {
		t.Errorf("dashboard.json: schemaVersion %d, want a current one (>= 36)", d.SchemaVersion)
	}
	metrics := registered(t)
	recorded := recordedNames(loadRules(t))

	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		// label_values(metric, label)
		m := regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*(\w+)\s*\)`).FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: definition %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		checkExpr(t, "variable "+v.Name, fmt.Sprintf(`%s{%s=~".+"}`, m[1], m[2]), metrics, recorded)
	}
	for _, v := range []string{"datasource", "pipeline"} {
		if !vars[v] {
			t.Errorf("dashboard.json: no %q variable", v)
		}
	}

	var all []panel
	for _, p := range d.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
	}
	ids := map[int]string{}
	var used []string
	nPanels := 0
	for _, p := range all {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("%s: id also used by %q", where, prev)
		}
		ids[p.ID] = p.Title
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Errorf("%s: no gridPos", where)
		}
		if p.Type == "row" {
			continue
		}
		nPanels++
		if compactJSON(p.Datasource) != wantDatasource {
			t.Errorf("%s: datasource %s, want %s", where, p.Datasource, wantDatasource)
		}
		exprs := 0
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				continue
			}
			exprs++
			if len(tg.Datasource) > 0 && compactJSON(tg.Datasource) != wantDatasource {
				t.Errorf("%s target %s: datasource %s, want %s", where, tg.RefID, tg.Datasource, wantDatasource)
			}
			expr, err := substituteVars(tg.Expr)
			if err != nil {
				t.Errorf("%s target %s: %v", where, tg.RefID, err)
				continue
			}
			used = append(used, checkExpr(t, where+" target "+tg.RefID, expr, metrics, recorded)...)
		}
		if exprs == 0 {
			t.Errorf("%s: no target with a PromQL expression", where)
		}
	}
	// The panels the operations section of deploy/README.md refers to.
	for _, name := range []string{"idemstream_consumer_lag", "idemstream_records_total", "idemstream_dlq_records_total",
		"idemstream_decision_duration_seconds_bucket", "idemstream_store_duration_seconds_bucket",
		"idemstream_rebalances_total", "idemstream_inflight_records", "idemstream_store_errors_total"} {
		if !contains(used, name) {
			t.Errorf("dashboard.json: no panel uses %s", name)
		}
	}
	t.Logf("%d panels", nPanels)
}
