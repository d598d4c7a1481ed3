package load

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
)

// avroBacklog is what the Avro rounds of make load LOAD_PAYLOAD=avro read:
// the JSON backlog's commands, record for record (the same keys, headers
// and values), in Avro in the registry's wire format on a topic of their
// own, behind a real registry that knows their schema.
type avroBacklog struct {
	registry string    // the registry's Confluent API
	w        *workload // what was written, for the checks
	input    offsets
	end      map[int]int64
	runs     []idemRun // one per round, each right after the round's JSON run
}

// avroRoundName names what the Avro run of round r owns, as roundName
// does for the JSON run.
func avroRoundName(run string, r int) string { return run + "-a" + strconv.Itoa(r+1) }

// produceAvroBacklog starts a registry, registers commandSchema under the
// Avro input's subject, creates the Avro rounds' topics and writes the n
// records that newWorkload(seed, run) makes, in Avro.
func produceAvroBacklog(ctx context.Context, t *testing.T, brokers []string, client *kafka.Client, run string, seed uint64, n, rounds int) *avroBacklog {
	t.Helper()
	reg := testenv.StartSchemaRegistry(t)
	in := run + ".avro-in"
	topics := []string{in}
	for r := range rounds {
		topics = append(topics, avroRoundName(run, r)+".out", avroRoundName(run, r)+".dlq")
	}
	testenv.CreateTopics(t, brokers, partitions, topics...)
	id, err := registerCommandSchema(ctx, reg.URL, in+"-value")
	if err != nil {
		t.Fatal(err)
	}
	a := &avroBacklog{registry: reg.URL, w: newWorkload(seed, run), input: offsets{client: client, topic: in}, runs: make([]idemRun, rounds)}
	a.w.avroID = id
	began := time.Now()
	if err := produce(ctx, brokers, in, a.w, n); err != nil {
		t.Fatal(err)
	}
	produced := time.Since(began)
	if a.end, err = a.input.end(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sum(a.end); got != int64(n) {
		t.Fatalf("the Avro input holds %d records, want %d", got, n)
	}
	avroSize, jsonSize := meanSizes(seed, run, id, min(n, 5000))
	t.Logf("Avro backlog: the same %d records in Avro (schema id %d under %s-value, registry %s), mean %.0f bytes a record against %.0f in JSON (first %d records), produced in %v",
		n, id, in, reg.URL, avroSize, jsonSize, min(n, 5000), produced.Round(time.Millisecond))
	return a
}

// meanSizes is the mean size of the first n records of the workload in
// Avro and in JSON.
func meanSizes(seed uint64, run string, id uint32, n int) (avro, json float64) {
	js, av := newWorkload(seed, run), newWorkload(seed, run)
	av.avroID = id
	var a, j int
	for range n {
		a += len(av.next(-1).Value)
		j += len(js.next(-1).Value)
	}
	return float64(a) / float64(n), float64(j) / float64(n)
}

// report prints each Avro round beside the JSON round just before it (the
// two ran back to back between the same passthrough runs): rates, CPU per
// record of each process, the Avro/JSON rate and consumer CPU ratios, and
// their medians. Ratios have three decimals: the goal is 0.9.
func (a *avroBacklog) report(t *testing.T, n int, jsonRuns []idemRun, passRuns []passRun, step int, redisAddr string) {
	t.Helper()
	rate := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
	ratios, cpuRatios := make([]float64, len(a.runs)), make([]float64, len(a.runs))
	var avroRates, jsonRates []float64
	for r, ar := range a.runs {
		jr, p := jsonRuns[r], step*r
		ratios[r] = rate(ar.time) / rate(jr.time)
		cpuRatios[r] = math.NaN()
		if ar.cpu.consumer >= 0 && jr.cpu.consumer > 0 {
			cpuRatios[r] = ar.cpu.consumer / jr.cpu.consumer
		}
		avroRates, jsonRates = append(avroRates, rate(ar.time)), append(jsonRates, rate(jr.time))
		bracket := 2 * float64(n) / (passRuns[p].time + passRuns[p+1].time).Seconds()
		t.Logf("round %d: idemstream run over the Avro backlog (payload avro through the registry, the same rules, Redis %s): %.0f records/s (%v from process start to lag 0); %.3f × the JSON round before it (%.0f records/s); %.2f of passthrough runs %d and %d around both (JSON %.2f); CPU per record: %s (JSON: %s); consumer CPU %.3f × the JSON round's; peak RSS %.0f MB; the rest of the machine %s of CPU during the run (JSON: %s)",
			r+1, redisAddr, rate(ar.time), ar.time.Round(time.Millisecond), ratios[r], rate(jr.time), rate(ar.time)/bracket, p, p+1, rate(jr.time)/bracket,
			ar.cpu.perRecord(n, ar.redisCPU), jr.cpu.perRecord(n, jr.redisCPU), cpuRatios[r], mb(ar.peak), otherCPU(ar), otherCPU(jr))
		reportStore(t, ar.metrics, n)
	}
	t.Logf("Avro / JSON: median rate ratio %.3f over %d rounds, each Avro round to the JSON round just before it (goal >= 0.9); median consumer CPU per record %.3f × the JSON rounds'; median rates: Avro %.0f, JSON %.0f records/s",
		median(ratios), len(ratios), median(cpuRatios), median(avroRates), median(jsonRates))
}

// otherCPU is the CPU time that the machine spent during an idemstream
// run on anything but idemstream, the broker and Redis (this test's
// polling and the idle registry included): another job's share of the
// cores, which makes a round no match for the one beside it.
func otherCPU(ir idemRun) string {
	if ir.machineCPU < 0 || ir.cpu.consumer < 0 || ir.cpu.broker < 0 {
		return "?"
	}
	return time.Duration((ir.machineCPU - ir.cpu.consumer - ir.cpu.broker - ir.redisCPU) * float64(time.Second)).Round(10 * time.Millisecond).String()
}

// verify checks every Avro round's topics as the JSON rounds' are
// checked: one result per key, no dead letter, first + replay = records.
func (a *avroBacklog) verify(ctx context.Context, t *testing.T, brokers []string, client *kafka.Client, run string) {
	t.Helper()
	for r, ar := range a.runs {
		name := avroRoundName(run, r)
		t.Logf("Avro round %d:", r+1)
		verifyResults(ctx, t, brokers, client, name+".out", name+".dlq", a.w, sumBy(ar.metrics, "idemstream_records_total", "outcome"))
	}
}
