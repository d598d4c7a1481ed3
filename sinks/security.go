package sinks

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemstream/idemstream/schemas"
)

// security builds the TLS and SASL settings of cfg.Kafka, for a consumer
// group's dialer and a client's transport alike; getenv reads the
// password that kafka.sasl.password_env names. Errors name the field.
func security(cfg *schemas.Config, getenv func(string) string) (*kafka.Dialer, *kafka.Transport, error) {
	dialer := &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true, ClientID: cfg.Kafka.ClientID}
	transport := &kafka.Transport{ClientID: cfg.Kafka.ClientID, DialTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second}
	if t := cfg.Kafka.TLS; t != nil && (t.Enabled || t.CAFile != "" || t.CertFile != "") {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
		if t.CAFile != "" {
			pem, err := os.ReadFile(cfg.Resolve(t.CAFile))
			if err != nil {
				return nil, nil, &schemas.FieldError{Field: "kafka.tls.ca_file", Msg: err.Error()}
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, nil, &schemas.FieldError{Field: "kafka.tls.ca_file", Msg: "no PEM certificate in " + t.CAFile}
			}
			tc.RootCAs = pool
		}
		if t.CertFile != "" || t.KeyFile != "" {
			cert, err := tls.LoadX509KeyPair(cfg.Resolve(t.CertFile), cfg.Resolve(t.KeyFile))
			if err != nil {
				return nil, nil, &schemas.FieldError{Field: "kafka.tls.cert_file", Msg: err.Error()}
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		dialer.TLS, transport.TLS = tc, tc
	}
	if s := cfg.Kafka.SASL; s != nil {
		password := getenv(s.PasswordEnv)
		if password == "" {
			return nil, nil, &schemas.FieldError{Field: "kafka.sasl.password_env", Msg: "environment variable " + s.PasswordEnv + " is empty"}
		}
		var mech sasl.Mechanism
		switch s.Mechanism {
		case "plain":
			mech = plain.Mechanism{Username: s.Username, Password: password}
		case "scram-sha-256", "scram-sha-512":
			algo := scram.SHA256
			if s.Mechanism == "scram-sha-512" {
				algo = scram.SHA512
			}
			m, err := scram.Mechanism(algo, s.Username, password)
			if err != nil {
				return nil, nil, &schemas.FieldError{Field: "kafka.sasl", Msg: err.Error()}
			}
			mech = m
		}
		dialer.SASLMechanism, transport.SASL = mech, mech
	}
	return dialer, transport, nil
}

// Connect is the reader and writer of the Kafka cluster cfg.Kafka names:
// its brokers, TLS, SASL and compression, so that a tool reads and writes
// exactly as `idemstream run` does; Dialer gives a consumer group the same
// TLS and SASL. Errors name the field. Close it when done.
func Connect(cfg *schemas.Config, getenv func(string) string) (*Kafka, error) {
	dialer, transport, err := security(cfg, getenv)
	if err != nil {
		return nil, err
	}
	k := NewKafka(&kafka.Client{Addr: kafka.TCP(cfg.Kafka.Brokers...), Timeout: 10 * time.Second, Transport: transport})
	k.dialer = dialer
	if k.Compression, err = ParseCompression(cfg.Kafka.Compression); err != nil {
		return nil, &schemas.FieldError{Field: "kafka.compression", Msg: err.Error()}
	}
	return k, nil
}
