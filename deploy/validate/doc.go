// Package validate checks the files of deploy/ offline, against the code
// they describe: the Prometheus rules and the Grafana dashboard use only
// metrics that idemstream registers, the Kubernetes manifests decode
// strictly into the API types, the compose file loads with compose-go, and
// every idemstream configuration shipped there loads with schemas.Parse.
//
// It is its own Go module so that the product's go.mod stays free of the
// Prometheus, Kubernetes and compose modules. Run it with
//
//	deploy/validate/run.sh
//
// or `cd deploy/validate && go test ./...`.
package validate
