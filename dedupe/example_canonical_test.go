package dedupe_test

import (
	"fmt"

	"github.com/idemstream/idemstream/dedupe"
)

// Two retries of one coupon claim differ only in volatile fields and member
// order, so they share a fingerprint; a claim for another amount does not,
// and Diff says why.
func ExampleCanonicalizer_Fingerprint() {
	c, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{
		Volatile: []string{"/client_time", "/retry_count"},
	})
	if err != nil {
		panic(err)
	}
	first := []byte(`{"coupon":"SPRING24","user":"u-42","amount":50,"client_time":"2024-05-01T12:00:00Z"}`)
	retry := []byte(`{"client_time":"2024-05-01T12:00:07Z","retry_count":1,"amount":50.0,"user":"u-42","coupon":"SPRING24"}`)
	other := []byte(`{"coupon":"SPRING24","user":"u-42","amount":60,"client_time":"2024-05-01T12:01:00Z"}`)

	fp1, _ := c.Fingerprint(first)
	fp2, _ := c.Fingerprint(retry)
	fp3, _ := c.Fingerprint(other)
	fmt.Println("retry is the same request:", fp1 == fp2)
	fmt.Println("other is the same request:", fp1 == fp3)

	canonical, _ := c.AppendCanonical(nil, retry)
	fmt.Println(string(canonical))

	diff, _ := c.Diff(first, other)
	fmt.Println("differs at:", diff)
	// Output:
	// retry is the same request: true
	// other is the same request: false
	// {"amount":50,"coupon":"SPRING24","user":"u-42"}
	// differs at: [/amount]
}

// Diff names the fields that make two payloads different requests, as the
// dead letter of a conflict and `idemstream diff` do: volatile fields and
// member order never count, numbers compare by value.
func ExampleCanonicalizer_Diff() {
	c, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{Volatile: []string{"/client_time"}})
	if err != nil {
		panic(err)
	}
	first := []byte(`{"user":"u-42","items":[{"sku":"A","qty":1}],"amount":50,"client_time":"12:00:00"}`)
	reuse := []byte(`{"amount":50.0,"items":[{"sku":"A","qty":2}],"user":"u-7","client_time":"12:00:09"}`)
	diff, err := c.Diff(first, reuse)
	if err != nil {
		panic(err)
	}
	fmt.Println(diff)
	// Output:
	// [/items/0/qty /user]
}
