package load

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/twmb/franz-go/pkg/sr"
)

// commandSchema is the workload's command in Avro: the JSON text's
// members, in the order a first copy's JSON writes them, each of the type
// its JSON value has. The amounts are decimals of scale 2, which decode to
// the same number text as the JSON's ("12.05", "10.00"); the integers are
// ints but for client_ts, which needs a long.
const commandSchema = `{"type":"record","name":"Command","namespace":"load.v1","fields":[
 {"name":"client_time","type":"string"},
 {"name":"retry_count","type":"int"},
 {"name":"trace_id","type":"string"},
 {"name":"user_id","type":"string"},
 {"name":"coupon_id","type":"int"},
 {"name":"campaign","type":"string"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
 {"name":"currency","type":"string"},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[
   {"name":"sku","type":"string"},
   {"name":"qty","type":"int"},
   {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
   {"name":"client_ts","type":"long"}]}}},
 {"name":"shipping","type":{"type":"record","name":"Shipping","fields":[
   {"name":"name","type":"string"},
   {"name":"street","type":"string"},
   {"name":"city","type":"string"},
   {"name":"zip","type":"string"},
   {"name":"country","type":"string"}]}},
 {"name":"note","type":"string"}]}`

// appendAvro appends the command in the registry's wire format: a 0 byte,
// the schema id (4 bytes, big-endian), then the Avro binary encoding of
// commandSchema. A retry's members are in the schema's order like every
// record's; its values and its items' order are what differ.
func (cmd *command) appendAvro(b []byte, schemaID uint32) []byte {
	b = append(b, 0)
	b = binary.BigEndian.AppendUint32(b, schemaID)
	b = avroString(b, cmd.clientTime)
	b = avroLong(b, int64(cmd.retryCount))
	b = avroString(b, cmd.traceID)
	b = avroString(b, cmd.userID)
	b = avroLong(b, int64(cmd.couponID))
	b = avroString(b, cmd.campaign)
	b = avroDecimal(b, int64(cmd.amount))
	b = avroString(b, cmd.currency)
	// One block of all the items, then the 0 that ends the array.
	b = avroLong(b, int64(len(cmd.items)))
	for _, it := range cmd.items {
		b = avroString(b, it.sku)
		b = avroLong(b, int64(it.qty))
		b = avroDecimal(b, int64(it.price))
		b = avroLong(b, it.clientTS)
	}
	b = avroLong(b, 0)
	for _, s := range []string{cmd.shipName, cmd.shipStreet, shipCity, cmd.shipZip, shipCountry, cmd.note} {
		b = avroString(b, s)
	}
	return b
}

// avroLong appends an int or a long: zig-zag, then a varint.
func avroLong(b []byte, v int64) []byte {
	return binary.AppendUvarint(b, uint64(v<<1)^uint64(v>>63))
}

// avroString appends a string (or bytes): its length, then its bytes.
func avroString(b []byte, s string) []byte {
	return append(avroLong(b, int64(len(s))), s...)
}

// avroDecimal appends a bytes decimal: the unscaled value in the fewest
// big-endian two's-complement bytes that hold it.
func avroDecimal(b []byte, unscaled int64) []byte {
	var full [8]byte
	binary.BigEndian.PutUint64(full[:], uint64(unscaled))
	i := 0
	for i < 7 && ((full[i] == 0 && full[i+1] < 0x80) || (full[i] == 0xff && full[i+1] >= 0x80)) {
		i++
	}
	b = avroLong(b, int64(8-i))
	return append(b, full[i:]...)
}

// registerCommandSchema registers commandSchema under subject in the
// registry at url and returns its id.
func registerCommandSchema(ctx context.Context, url, subject string) (uint32, error) {
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		return 0, err
	}
	s, err := cl.CreateSchema(ctx, subject, sr.Schema{Schema: commandSchema, Type: sr.TypeAvro})
	if err != nil {
		return 0, fmt.Errorf("register the command's schema under %s: %w", subject, err)
	}
	if s.ID <= 0 {
		return 0, fmt.Errorf("the registry gave the command's schema id %d", s.ID)
	}
	return uint32(s.ID), nil
}
