package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemstream/idemstream/dedupe"
)

// FuzzProtoDecode decodes arbitrary bytes as a claim and as a proto2 node
// (groups, recursion, every scalar kind). A decoding never panics or
// hangs; it either fails with one of the three sentinels or gives JSON the
// canonicalizer accepts and that equals, canonicalized, what the Protobuf
// runtime reads from the same bytes; and whatever the runtime refuses, the
// walk refuses too.
func FuzzProtoDecode(f *testing.F) {
	claim := pbClaimMD(f)
	node := pbMessage(f, pbCompile(f, "legacy/node.proto", pbSources()), "legacy.Node")
	f.Add(pbMarshal(f, pbBenchClaim(claim)))
	f.Add(pbMarshal(f, pbNew(claim, "big", uint64(math.MaxUint64), "channel", 9, "region_id", 0,
		"tags", map[any]any{int64(-1): "x"}, "ratio", math.Copysign(0, -1))))
	f.Add(pbFields(19, []byte{1, 2, 0xff, 1}, 19, uint64(4), 8, pbFields(1, "k", 2, "v"), 8, pbFields(1, "k")))
	f.Add(pbFields(10, pbFields(1, uint64(5)), 14, "s", 15, uint64(1), 10, pbFields(2, uint64(7)), 14, "t"))
	f.Add(pbFields(3, pbFields(6, uint64(1), 2, pbFields(6, uint64(2))), 16, pbFields(6, uint64(3)), 17, "r"))
	f.Add(append(protowire.AppendTag(pbFields(1, uint64(3)), 4, protowire.StartGroupType),
		append(pbFields(1, "g", 2, uint64(1)), protowire.AppendTag(nil, 4, protowire.EndGroupType)...)...))
	f.Add([]byte{0x0a, 0x80})
	canon, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, md := range []protoreflect.MessageDescriptor{claim, node} {
			out, err := appendProtoJSON(nil, md, data)
			if err != nil {
				if !errors.Is(err, dedupe.ErrMalformedPayload) && !errors.Is(err, dedupe.ErrIncompatibleSchema) &&
					!errors.Is(err, dedupe.ErrNonFiniteNumber) {
					t.Fatalf("%s: error without a sentinel: %v", md.FullName(), err)
				}
			} else {
				if !json.Valid(out) {
					t.Fatalf("%s: not JSON: %s", md.FullName(), out)
				}
				if _, err := canon.AppendCanonical(nil, out); err != nil {
					t.Fatalf("%s: the canonicalizer refuses %s: %v", md.FullName(), out, err)
				}
				// The output does not depend on what dst held.
				again, _ := appendProtoJSON([]byte("x"), md, data)
				if !bytes.Equal(again[1:], out) {
					t.Fatalf("%s: two decodings differ", md.FullName())
				}
			}
			if md == claim { // proto2's closed enums read differently by design
				pbMatchesRuntime(t, md, data)
			}
		}
	})
}
