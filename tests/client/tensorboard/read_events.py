#!/usr/bin/env python3
"""Reads a TensorBoard event file the way TensorBoard does, independently of sftctl's C++ code.

usage: read_events.py PROTO_OUT_DIR EVENT_FILE

PROTO_OUT_DIR holds event_pb2.py and summary_pb2.py (protoc --python_out from this folder's
.proto files). Every record's framing is checked (masked CRC-32C of the length and of the data);
every Event is parsed with python3-protobuf, and must use no field the protos do not know. Prints one
JSON object per summary value, {"wall_time", "step", "tag", and "value" (a float32 widened to
double) or "text" and "plugin"}, and one {"file_version"} object; exits 1 with a message on any
mismatch.
"""
import json
import struct
import sys


def crc32c(data):
    # Bitwise CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): deliberately not table-driven.
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def fail(message):
    print("read_events.py: " + message, file=sys.stderr)
    sys.exit(1)


def main():
    sys.path.insert(0, sys.argv[1])
    import event_pb2  # noqa: E402  (generated at test time)

    with open(sys.argv[2], "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if len(data) - pos < 12:
            fail("byte %d: truncated record header" % pos)
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if length_crc != masked(header):
            fail("byte %d: length CRC mismatch" % pos)
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or len(data) < pos + 16 + length:
            fail("byte %d: truncated record" % pos)
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if data_crc != masked(body):
            fail("byte %d: data CRC mismatch" % pos)
        event = event_pb2.Event.FromString(body)
        for message in [event, event.summary] + list(event.summary.value):
            if len(message.UnknownFields()) > 0:
                fail("byte %d: fields the protos do not know in %s" % (pos, type(message).__name__))
        if event.WhichOneof("what") == "file_version":
            print(json.dumps({"file_version": event.file_version, "wall_time": event.wall_time}))
        for v in event.summary.value:
            out = {"wall_time": event.wall_time, "step": event.step, "tag": v.tag}
            if v.WhichOneof("value") == "simple_value":
                out["value"] = v.simple_value
            elif v.WhichOneof("value") == "tensor":
                if v.tensor.dtype != 7 or len(v.tensor.string_val) != 1:
                    fail("byte %d: text tensor is not one DT_STRING" % pos)
                out["text"] = v.tensor.string_val[0].decode("utf-8")
                out["plugin"] = v.metadata.plugin_data.plugin_name
            else:
                fail("byte %d: value of tag %s has neither simple_value nor tensor" % (pos, v.tag))
            print(json.dumps(out))
        pos += 16 + length


if __name__ == "__main__":
    main()
