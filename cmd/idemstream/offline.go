package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/schemas"
)

// pipelineCanonicalizer loads the config and builds the canonicalizer of
// one pipeline: the same code path the consumer uses. schemaFile, when
// set, reads the payloads offline as plain (unframed) Avro or Protobuf of
// that .avsc or .proto, in place of the pipeline's registry.
func pipelineCanonicalizer(e *env, cf *configFlags, name, schemaFile string) (*dedupe.Canonicalizer, error) {
	cfg, err := cf.load(e)
	if err != nil {
		return nil, err
	}
	p, err := pickPipeline(cfg, name)
	if err != nil {
		return nil, err
	}
	if schemaFile != "" {
		if p, err = withSchemaFile(p, schemaFile); err != nil {
			return nil, err
		}
	}
	pol, err := cfg.Policy(p)
	if err != nil {
		return nil, err
	}
	return dedupe.NewCanonicalizer(pol.Rules)
}

// withSchemaFile points a pipeline at a local schema: an .avsc makes its
// payloads avro, a .proto protobuf, whatever the file said.
func withSchemaFile(p schemas.Pipeline, file string) (schemas.Pipeline, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return p, usagef("--schema %s: %v", file, err)
	}
	switch strings.ToLower(filepath.Ext(file)) {
	case ".avsc":
		p.Payload = string(dedupe.PayloadAvro)
	case ".proto":
		p.Payload = string(dedupe.PayloadProtobuf)
	default:
		return p, usagef("--schema %s: want an .avsc or a .proto file", file)
	}
	p.SchemaFile = abs
	if p.ReaderSchema != nil {
		p.ReaderSchema = &schemas.ReaderSchema{Message: p.ReaderSchema.Message}
	}
	return p, nil
}

// pickPipeline finds the --pipeline named, which may be left out when the
// config has one pipeline only.
func pickPipeline(cfg *schemas.Config, name string) (schemas.Pipeline, error) {
	if name == "" {
		if len(cfg.Pipelines) != 1 {
			return schemas.Pipeline{}, usagef("--pipeline NAME is required: the config has %d pipelines", len(cfg.Pipelines))
		}
		return cfg.Pipelines[0], nil
	}
	p, err := cfg.Pipeline(name)
	if err != nil {
		return schemas.Pipeline{}, usagef("%v", err)
	}
	return p, nil
}

func readInput(e *env, name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(e.stdin)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		// A file that is not there is bad usage, like a missing config.
		return nil, usagef("read %s: %v", name, errors.Unwrap(err))
	}
	return b, nil
}

func cmdHash(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "hash", "-c FILE [--pipeline NAME] [--schema FILE] [-o text|json] [FILE|-]")
	cf := addConfigFlags(fs)
	pipeline := fs.String("pipeline", "", "pipeline whose rules apply (optional when the config has one)")
	schemaFile := fs.String("schema", "", "read the payload offline as plain Avro or Protobuf of this .avsc or .proto (no registry framing)")
	outputOf := outputFlag(fs, "text", "text", "json")
	output, err := parseOutput(fs, args, outputOf)
	if err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return usagef("hash takes one payload file (or - for stdin), got %d", fs.NArg())
	}
	input := "-"
	if fs.NArg() == 1 {
		input = fs.Arg(0)
	}
	canon, err := pipelineCanonicalizer(e, cf, *pipeline, *schemaFile)
	if err != nil {
		return err
	}
	payload, err := readInput(e, input)
	if err != nil {
		return err
	}
	canonical, err := canon.AppendCanonical(nil, payload)
	if err != nil {
		return err
	}
	fp, err := canon.Fingerprint(payload)
	if err != nil {
		return err
	}
	if output == "json" {
		return writeJSON(e, map[string]any{"fingerprint": fp, "rules": canon.RulesDigest(), "canonical": json.RawMessage(canonical)})
	}
	fmt.Fprintf(e.stdout, "fingerprint: %s\nrules:       %s\ncanonical:   %s\n", fp, canon.RulesDigest(), canonical)
	return nil
}

// writeJSON prints v as indented JSON: the -o json form of every command.
func writeJSON(e *env, v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdDiff(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "diff", "-c FILE [--pipeline NAME] [--schema FILE] [-o text|json] A B")
	cf := addConfigFlags(fs)
	pipeline := fs.String("pipeline", "", "pipeline whose rules apply (optional when the config has one)")
	schemaFile := fs.String("schema", "", "read the payloads offline as plain Avro or Protobuf of this .avsc or .proto (no registry framing)")
	outputOf := outputFlag(fs, "text", "text", "json")
	output, err := parseOutput(fs, args, outputOf)
	if err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return usagef("diff takes two payload files A and B, got %d", fs.NArg())
	}
	canon, err := pipelineCanonicalizer(e, cf, *pipeline, *schemaFile)
	if err != nil {
		return err
	}
	var bodies [2][]byte
	var fps [2]string
	for i := range bodies {
		if bodies[i], err = readInput(e, fs.Arg(i)); err != nil {
			return err
		}
		if fps[i], err = canon.Fingerprint(bodies[i]); err != nil {
			return fmt.Errorf("%s: %w", fs.Arg(i), err)
		}
	}
	paths, err := canon.Diff(bodies[0], bodies[1])
	if err != nil {
		return err
	}
	if output == "json" {
		if paths == nil {
			paths = []string{}
		}
		return writeJSON(e, map[string]any{
			"a": map[string]string{"file": fs.Arg(0), "fingerprint": fps[0]}, "b": map[string]string{"file": fs.Arg(1), "fingerprint": fps[1]},
			"same": len(paths) == 0, "paths": paths})
	}
	fmt.Fprintf(e.stdout, "A: %s  %s\nB: %s  %s\n", fps[0], fs.Arg(0), fps[1], fs.Arg(1))
	if len(paths) == 0 {
		fmt.Fprintln(e.stdout, "same request: no difference once volatile fields are removed and unordered arrays sorted")
		return nil
	}
	fmt.Fprintf(e.stdout, "differs at %d path(s):\n%s\n", len(paths), strings.Join(paths, "\n"))
	return nil
}

func cmdContract(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "contract", "-c FILE [-o markdown|asyncapi|openapi]")
	cf := addConfigFlags(fs, "kafka.group")
	outputOf := outputFlag(fs, "markdown", "markdown", "asyncapi", "openapi")
	format, err := parseOutput(fs, args, outputOf)
	if err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("contract takes no arguments, got %q", fs.Args())
	}
	cfg, err := cf.load(e)
	if err != nil {
		return err
	}
	var out []byte
	switch format {
	case "asyncapi":
		out, err = schemas.ContractAsyncAPI(cfg)
	case "openapi":
		out, err = schemas.ContractOpenAPI(cfg)
	default:
		out, err = schemas.ContractMarkdown(cfg)
	}
	if err != nil {
		return err
	}
	_, err = e.stdout.Write(out)
	return err
}
