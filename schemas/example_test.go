package schemas_test

import (
	"fmt"

	"github.com/idemstream/idemstream/schemas"
)

// The configuration file is the contract: a program that embeds idemstream
// loads the same file as `idemstream run` and takes each pipeline's policy
// from it (consumer.Options.Policy). Fields left out take their defaults.
func ExampleParse() {
	cfg, err := schemas.Parse([]byte(`
pipelines:
  - name: coupon-claim
    input: coupon.claim.commands
    output: coupon.claim.results
    dlq: coupon.claim.dlq
    key: {from: header, name: Idempotency-Key, format: uuid}
    semantics: strict
    window: 10m
    volatile: [/client_time, /retry_count]
`), ".")
	if err != nil {
		panic(err)
	}
	p, err := cfg.Pipeline("coupon-claim")
	if err != nil {
		panic(err)
	}
	pol, err := cfg.Policy(p)
	if err != nil {
		panic(err)
	}
	fmt.Println("group:", cfg.ConsumerGroup(p))
	fmt.Println("semantics:", pol.Semantics, "window:", pol.Window)
	fmt.Println("volatile:", pol.Rules.Volatile)
	fmt.Println("pending_timeout:", pol.PendingTimeout, "failed_ttl:", pol.FailedTTL)
	// Output:
	// group: idemstream.coupon-claim
	// semantics: strict window: 10m0s
	// volatile: [/client_time /retry_count]
	// pending_timeout: 30s failed_ttl: 10m0s
}

// A configuration that breaks a rule is refused with the field named.
func ExampleParse_refused() {
	_, err := schemas.Parse([]byte(`
pipelines:
  - name: coupon-claim
    input: coupon.claim.commands
    output: coupon.claim.commands
    dlq: coupon.claim.dlq
`), ".")
	fmt.Println(err)
	// Output:
	// config: pipelines[0].output: "coupon.claim.commands" is also the input topic: idemstream would consume its own records
}
