package redisstore

// setArgs lays out the arguments of a batch's SETs in arrays made once
// per batch. go-redis takes every argument as an interface value, and a
// string, a byte slice or an int64 stored in one by value is an
// allocation each: three per SET, two SETs per first copy. A pointer is
// stored as it is, and go-redis's writer and its key routing (stringArg)
// read *string and *int64 as they read the values, and a *byteArg through
// encoding.BinaryMarshaler. Only go-redis's Cmd.String, which nothing here
// prints, shows them as pointers.
type setArgs struct {
	args  []any
	vals  []byteArg
	pxat  []int64
	width int
}

// byteArg is a value go-redis writes as a bulk string: a byte slice is
// not pointer-shaped, so it goes into an interface behind a pointer.
type byteArg []byte

// MarshalBinary implements encoding.BinaryMarshaler for go-redis.
func (b *byteArg) MarshalBinary() ([]byte, error) { return *b, nil }

// newSetArgs makes room for n SETs, each with opts options of its own
// between its value and PXAT.
func newSetArgs(n, opts int) *setArgs {
	width := 5 + opts
	return &setArgs{args: make([]any, n*width), vals: make([]byteArg, n), pxat: make([]int64, n), width: width}
}

// set returns the arguments of SET i: SET name value opts… PXAT at. name
// is a *string; value must stay unchanged until the command is sent.
func (a *setArgs) set(i int, name *string, value []byte, at int64, opts ...any) []any {
	a.vals[i], a.pxat[i] = value, at
	s := a.args[i*a.width : i*a.width : (i+1)*a.width]
	s = append(s, "SET", name, &a.vals[i])
	s = append(s, opts...)
	return append(s, "PXAT", &a.pxat[i])
}

// value is the value of SET i.
func (a *setArgs) value(i int) []byte { return a.vals[i] }
