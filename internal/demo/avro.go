package demo

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/idemstream/idemstream/schemas"
)

// claimSchema is the campaign's claim as a Java shop's producer would
// register it: the same fields as the JSON claims.
const claimSchema = `{"type":"record","name":"Claim","namespace":"coupon.v1","fields":[
 {"name":"user_id","type":"string"},{"name":"coupon_id","type":"long"},{"name":"amount","type":"long"},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"long"}]}}},
 {"name":"client_time","type":"string"},{"name":"retry_count","type":"int"},{"name":"trace_id","type":"string"}]}`

// avroCampaign is the campaign written in Avro through an in-process
// schema registry, as a registry's serializer writes it (the Confluent
// wire format).
type avroCampaign struct {
	registry *srfake.Registry
	id       int
}

// startAvro starts the registry and registers the claim under the
// subject the serializers use for topic's values.
func startAvro(topic string) (*avroCampaign, error) {
	reg := srfake.New()
	id, _, err := reg.RegisterSchema(topic+"-value", sr.Schema{Schema: claimSchema, Type: sr.TypeAvro})
	if err != nil {
		reg.Close()
		return nil, fmt.Errorf("register the claim schema: %w", err)
	}
	return &avroCampaign{registry: reg, id: id}, nil
}

func (a *avroCampaign) close() { a.registry.Close() }

// encode rewrites each command's body in Avro. A claim becomes its Avro
// record; a body that is no claim (the campaign's truncated JSON) becomes
// a record cut short, garbage in Avro as it was in JSON. The naive
// identity is taken again over the bytes as sent.
func (a *avroCampaign) encode(cmds []Command) []Command {
	out := make([]Command, len(cmds))
	for i, c := range cmds {
		var cl claim
		if err := json.Unmarshal(c.Body, &cl); err != nil {
			b := a.claimBytes(claim{UserID: "u-9998", CouponID: 12345, Amount: CouponValue})
			c.Body = b[:len(b)-3]
		} else {
			c.Body = a.claimBytes(cl)
		}
		c.NaiveKey = naiveKey(c.IdemKey, c.Body)
		out[i] = c
	}
	return out
}

func (a *avroCampaign) claimBytes(c claim) []byte {
	long := func(b []byte, v int64) []byte { return binary.AppendUvarint(b, uint64(v<<1)^uint64(v>>63)) }
	str := func(b []byte, s string) []byte { return append(long(b, int64(len(s))), s...) }
	b := binary.BigEndian.AppendUint32([]byte{0}, uint32(a.id))
	b = str(b, c.UserID)
	b = long(b, int64(c.CouponID))
	b = long(b, int64(c.Amount))
	if len(c.Items) > 0 {
		b = long(b, int64(len(c.Items)))
		for _, it := range c.Items {
			b = long(str(b, it.SKU), int64(it.Qty))
		}
	}
	b = long(b, 0)
	b = str(b, c.ClientTime)
	b = long(b, int64(c.RetryCount))
	return str(b, c.TraceID)
}

// config is the registry section and the idemstream pipeline's payload,
// appended to the demo's pipelines.
func (a *avroCampaign) config() string {
	return "    payload: avro\nschema_registry: {url: '" + a.registry.URL() + "'}\n"
}

// campaignPayload writes the campaign as opts.Payload says: the
// pipelines' configuration, and for avro the registry (closed by the
// caller) with the commands rewritten in Avro.
func campaignPayload(opts *Options, gen *Generated) (string, *avroCampaign, error) {
	switch opts.Payload {
	case "", "json":
		opts.Payload = "json"
		return pipelinesYAML, nil, nil
	case "avro":
		avro, err := startAvro(commandTopic)
		if err != nil {
			return "", nil, err
		}
		gen.Originals, gen.Later = avro.encode(gen.Originals), avro.encode(gen.Later)
		return pipelinesYAML + avro.config(), avro, nil
	}
	return "", nil, fmt.Errorf("payload %q: want json or avro", opts.Payload)
}

// reader is the desk's way back from Avro to the JSON claims it reads:
// the idemstream pipeline's own decoder.
func (a *avroCampaign) reader(ctx context.Context, cfg *schemas.Config) (func([]byte) ([]byte, error), error) {
	dec, err := cfg.Decoder(ctx, cfg.Pipelines[1])
	if err != nil {
		return nil, err
	}
	return readAs(dec), nil
}

// reader turns the desk's Avro commands back into the JSON claims it
// reads, with the idemstream pipeline's own decoder.
type reader interface {
	AppendJSON(dst, value []byte) ([]byte, error)
}

func readAs(r reader) func([]byte) ([]byte, error) {
	return func(b []byte) ([]byte, error) { return r.AppendJSON(nil, b) }
}
