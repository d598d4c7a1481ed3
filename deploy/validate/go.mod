module github.com/idemstream/idemstream/deploy/validate

go 1.26.7

require github.com/idemstream/idemstream v0.0.0

require (
	github.com/compose-spec/compose-go/v2 v2.16.2 // indirect
	github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring v0.95.2 // indirect
	github.com/prometheus/prometheus v0.316.0 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	k8s.io/api v0.37.2 // indirect
	k8s.io/apimachinery v0.37.2 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)

replace github.com/idemstream/idemstream => ../..
