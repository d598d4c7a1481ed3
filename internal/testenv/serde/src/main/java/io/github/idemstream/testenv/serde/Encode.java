package io.github.idemstream.testenv.serde;

import com.google.protobuf.AnyProto;
import com.google.protobuf.ApiProto;
import com.google.protobuf.DescriptorProtos;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorSet;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DurationProto;
import com.google.protobuf.DynamicMessage;
import com.google.protobuf.EmptyProto;
import com.google.protobuf.FieldMaskProto;
import com.google.protobuf.SourceContextProto;
import com.google.protobuf.StructProto;
import com.google.protobuf.TimestampProto;
import com.google.protobuf.TypeProto;
import com.google.protobuf.WrappersProto;
import com.google.protobuf.util.JsonFormat;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;

/**
 * Encodes records in the Confluent wire format with the reference Java
 * libraries, so that tests can check a Go decoder against bytes it did not
 * make itself.
 *
 * <pre>
 * avro SCHEMA_FILE SCHEMA_ID
 * protobuf DESCRIPTOR_SET_FILE MESSAGE_FULL_NAME SCHEMA_ID INDEXES
 * </pre>
 *
 * Each reads one JSON record a line on stdin (Avro's JSON encoding, or the
 * protobuf JSON mapping) and writes one line of lowercase hex a record on
 * stdout: 0x00, the schema id (4 bytes, big-endian), for protobuf the
 * message indexes, then the record in binary.
 */
public final class Encode {
  private static final String USAGE =
      "usage: Encode avro SCHEMA_FILE SCHEMA_ID\n"
          + "       Encode protobuf DESCRIPTOR_SET_FILE MESSAGE_FULL_NAME SCHEMA_ID INDEXES\n"
          + "JSON records on stdin, one a line; hex lines on stdout.";

  private Encode() {}

  /** A bad argument or record: the message goes to stderr, the exit code is 1. */
  private static final class Failure extends Exception {
    Failure(String message) {
      super(message);
    }
  }

  /** Encodes one JSON line into the bytes that follow the header. */
  private interface Body {
    byte[] encode(String json) throws Exception;
  }

  public static void main(String[] args) {
    PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
    try {
      run(args, out);
    } catch (Failure e) {
      System.err.println("encode: " + e.getMessage());
      System.exit(1);
    } catch (Exception e) {
      System.err.println("encode: " + e);
      System.exit(1);
    }
    out.flush();
    if (out.checkError()) {
      System.err.println("encode: writing stdout failed");
      System.exit(1);
    }
  }

  private static void run(String[] args, PrintStream out) throws Exception {
    if (args.length == 3 && args[0].equals("avro")) {
      byte[] header = header(schemaId(args[2]), new byte[0]);
      encodeLines(header, avro(Path.of(args[1])), out);
    } else if (args.length == 5 && args[0].equals("protobuf")) {
      byte[] header = header(schemaId(args[3]), messageIndexes(args[4]));
      encodeLines(header, protobuf(Path.of(args[1]), args[2]), out);
    } else {
      throw new Failure(USAGE);
    }
  }

  private static void encodeLines(byte[] header, Body body, PrintStream out) throws Exception {
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    HexFormat hex = HexFormat.of();
    int n = 0;
    for (String line = in.readLine(); line != null; line = in.readLine()) {
      n++;
      if (line.isBlank()) {
        continue;
      }
      byte[] record;
      try {
        record = body.encode(line);
      } catch (Exception e) {
        throw new Failure("line " + n + ": " + e);
      }
      out.print(hex.formatHex(header));
      out.print(hex.formatHex(record));
      out.print('\n');
    }
  }

  private static int schemaId(String s) throws Failure {
    try {
      return Integer.parseInt(s);
    } catch (NumberFormatException e) {
      throw new Failure("schema id " + s + " is not a 32-bit integer");
    }
  }

  /** The magic byte 0x00, the id big-endian, then what follows it. */
  private static byte[] header(int id, byte[] rest) {
    ByteArrayOutputStream b = new ByteArrayOutputStream();
    b.write(0);
    b.write(id >>> 24);
    b.write(id >>> 16);
    b.write(id >>> 8);
    b.write(id);
    b.writeBytes(rest);
    return b.toByteArray();
  }

  private static Body avro(Path schemaFile) throws IOException {
    Schema schema = new Schema.Parser().parse(schemaFile.toFile());
    GenericDatumReader<Object> reader = new GenericDatumReader<>(schema);
    GenericDatumWriter<Object> writer = new GenericDatumWriter<>(schema);
    return json -> {
      Object datum = reader.read(null, DecoderFactory.get().jsonDecoder(schema, json));
      ByteArrayOutputStream b = new ByteArrayOutputStream();
      BinaryEncoder enc = EncoderFactory.get().directBinaryEncoder(b, null);
      writer.write(datum, enc);
      enc.flush();
      return b.toByteArray();
    };
  }

  /**
   * Confluent's message indexes: the path from the file's top-level
   * messages to the record's message. [0], the first message, is the single
   * byte 0x00; any other path is its length, then each index, as zig-zag
   * varints.
   */
  static byte[] messageIndexes(String spec) throws Failure {
    String[] parts = spec.split(",", -1);
    int[] idx = new int[parts.length];
    for (int i = 0; i < parts.length; i++) {
      try {
        idx[i] = Integer.parseInt(parts[i].trim());
      } catch (NumberFormatException e) {
        throw new Failure("INDEXES " + spec + " is not a comma-separated list of integers");
      }
      if (idx[i] < 0) {
        throw new Failure("INDEXES " + spec + " has a negative index");
      }
    }
    ByteArrayOutputStream b = new ByteArrayOutputStream();
    if (idx.length == 1 && idx[0] == 0) {
      b.write(0);
      return b.toByteArray();
    }
    zigzagVarint(b, idx.length);
    for (int i : idx) {
      zigzagVarint(b, i);
    }
    return b.toByteArray();
  }

  private static void zigzagVarint(ByteArrayOutputStream b, int n) {
    int v = (n << 1) ^ (n >> 31);
    while ((v & ~0x7f) != 0) {
      b.write((v & 0x7f) | 0x80);
      v >>>= 7;
    }
    b.write(v);
  }

  private static Body protobuf(Path setFile, String messageName) throws Exception {
    FileDescriptorSet set = FileDescriptorSet.parseFrom(Files.readAllBytes(setFile));
    Map<String, FileDescriptorProto> protos = new HashMap<>();
    for (FileDescriptorProto p : set.getFileList()) {
      protos.put(p.getName(), p);
    }
    Map<String, FileDescriptor> files = new HashMap<>();
    Map<String, Descriptor> messages = new HashMap<>();
    JsonFormat.TypeRegistry.Builder types = JsonFormat.TypeRegistry.newBuilder();
    for (FileDescriptorProto p : set.getFileList()) {
      FileDescriptor fd = build(p.getName(), protos, files);
      collect(fd.getMessageTypes(), messages);
      types.add(fd.getMessageTypes());
    }
    Descriptor message = messages.get(messageName);
    if (message == null) {
      throw new Failure("no message " + messageName + " in " + setFile);
    }
    JsonFormat.Parser parser = JsonFormat.parser().usingTypeRegistry(types.build());
    return json -> {
      DynamicMessage.Builder b = DynamicMessage.newBuilder(message);
      parser.merge(json, b);
      return b.build().toByteArray();
    };
  }

  private static void collect(List<Descriptor> ds, Map<String, Descriptor> into) {
    for (Descriptor d : ds) {
      into.put(d.getFullName(), d);
      collect(d.getNestedTypes(), into);
    }
  }

  /**
   * Builds a file of the set after its imports. An import the set lacks may
   * be one of the well-known types, which protobuf-java carries.
   */
  private static FileDescriptor build(
      String name, Map<String, FileDescriptorProto> protos, Map<String, FileDescriptor> built)
      throws Failure, DescriptorValidationException {
    FileDescriptor fd = built.get(name);
    if (fd != null) {
      return fd;
    }
    FileDescriptorProto p = protos.get(name);
    if (p == null) {
      fd = wellKnown(name);
      if (fd == null) {
        throw new Failure("the descriptor set lacks " + name);
      }
      built.put(name, fd);
      return fd;
    }
    FileDescriptor[] deps = new FileDescriptor[p.getDependencyCount()];
    for (int i = 0; i < deps.length; i++) {
      deps[i] = build(p.getDependency(i), protos, built);
    }
    fd = FileDescriptor.buildFrom(p, deps);
    built.put(name, fd);
    return fd;
  }

  private static FileDescriptor wellKnown(String name) {
    switch (name) {
      case "google/protobuf/any.proto":
        return AnyProto.getDescriptor();
      case "google/protobuf/api.proto":
        return ApiProto.getDescriptor();
      case "google/protobuf/descriptor.proto":
        return DescriptorProtos.getDescriptor();
      case "google/protobuf/duration.proto":
        return DurationProto.getDescriptor();
      case "google/protobuf/empty.proto":
        return EmptyProto.getDescriptor();
      case "google/protobuf/field_mask.proto":
        return FieldMaskProto.getDescriptor();
      case "google/protobuf/source_context.proto":
        return SourceContextProto.getDescriptor();
      case "google/protobuf/struct.proto":
        return StructProto.getDescriptor();
      case "google/protobuf/timestamp.proto":
        return TimestampProto.getDescriptor();
      case "google/protobuf/type.proto":
        return TypeProto.getDescriptor();
      case "google/protobuf/wrappers.proto":
        return WrappersProto.getDescriptor();
      default:
        return null;
    }
  }
}
