"""Reading what travels on NATS: a msgpack inspector that keeps wire types,
and the schema and load score of a recorded payload."""

from __future__ import annotations

import base64
import json
import struct


# ------------------------------------------------------- msgpack inspector


def mp_describe(buf: bytes):
    """Decode one msgpack value, keeping each value's wire format name.

    Returns (value, end) where value is {"type": ..., "value": ...}; maps keep
    their key order as a list of [key, value] pairs.
    """

    def rd(i: int):
        b = buf[i]
        if b <= 0x7F:
            return {"type": "positive_fixint", "value": b}, i + 1
        if 0x80 <= b <= 0x8F:
            return rd_map(i + 1, b & 0x0F, "fixmap")
        if 0x90 <= b <= 0x9F:
            return rd_arr(i + 1, b & 0x0F, "fixarray")
        if 0xA0 <= b <= 0xBF:
            n = b & 0x1F
            return {"type": "fixstr", "value": buf[i + 1 : i + 1 + n].decode("utf-8", "replace")}, i + 1 + n
        if b >= 0xE0:
            return {"type": "negative_fixint", "value": b - 256}, i + 1
        if b == 0xC0:
            return {"type": "nil", "value": None}, i + 1
        if b in (0xC2, 0xC3):
            return {"type": "bool", "value": b == 0xC3}, i + 1
        if b in (0xC4, 0xC5, 0xC6):
            w = {0xC4: 1, 0xC5: 2, 0xC6: 4}[b]
            n = int.from_bytes(buf[i + 1 : i + 1 + w], "big")
            s = i + 1 + w
            return {"type": f"bin{8 * w}", "len": n, "value": buf[s : s + n]}, s + n
        if b in (0xCA, 0xCB):
            if b == 0xCA:
                return {"type": "float32", "value": struct.unpack(">f", buf[i + 1 : i + 5])[0]}, i + 5
            return {"type": "float64", "value": struct.unpack(">d", buf[i + 1 : i + 9])[0]}, i + 9
        if 0xCC <= b <= 0xCF:
            w = 1 << (b - 0xCC)
            return {"type": f"uint{8 * w}", "value": int.from_bytes(buf[i + 1 : i + 1 + w], "big")}, i + 1 + w
        if 0xD0 <= b <= 0xD3:
            w = 1 << (b - 0xD0)
            v = int.from_bytes(buf[i + 1 : i + 1 + w], "big", signed=True)
            return {"type": f"int{8 * w}", "value": v}, i + 1 + w
        if b in (0xD9, 0xDA, 0xDB):
            w = {0xD9: 1, 0xDA: 2, 0xDB: 4}[b]
            n = int.from_bytes(buf[i + 1 : i + 1 + w], "big")
            s = i + 1 + w
            return {"type": f"str{8 * w}", "value": buf[s : s + n].decode("utf-8", "replace")}, s + n
        if b in (0xDC, 0xDD):
            w = 2 if b == 0xDC else 4
            return rd_arr(i + 1 + w, int.from_bytes(buf[i + 1 : i + 1 + w], "big"), f"array{8 * w}")
        if b in (0xDE, 0xDF):
            w = 2 if b == 0xDE else 4
            return rd_map(i + 1 + w, int.from_bytes(buf[i + 1 : i + 1 + w], "big"), f"map{8 * w}")
        raise ValueError(f"unsupported msgpack byte 0x{b:02x} at {i}")

    def rd_map(i: int, n: int, t: str):
        items = []
        for _ in range(n):
            k, i = rd(i)
            v, i = rd(i)
            items.append([k["value"], v])
        return {"type": t, "value": items}, i

    def rd_arr(i: int, n: int, t: str):
        items = []
        for _ in range(n):
            v, i = rd(i)
            items.append(v)
        return {"type": t, "value": items}, i

    return rd(0)


def mp_plain(node, inner_bin_keys=("payload",), key=None):
    """The decoded value as plain JSON, each leaf written as "<wire type>:<value>"."""
    t, v = node["type"], node["value"]
    if t.endswith("map"):
        return {str(k): mp_plain(val, inner_bin_keys, k) for k, val in v}
    if "array" in t:
        return [mp_plain(x, inner_bin_keys) for x in v]
    if t.startswith("bin"):
        if key in inner_bin_keys:
            try:
                inner, end = mp_describe(v)
                if end == len(v):
                    return {"<bin decoded as msgpack>": mp_plain(inner, inner_bin_keys)}
            except Exception:  # not msgpack: keep the bytes
                pass
        return f"{t}:{base64.b64encode(v).decode()}"
    return f"{t}:{json.dumps(v)}"


def mp_schema(node, prefix=""):
    """Flat {key path: wire type} of a decoded value (arrays: first element)."""
    out = {}
    t, v = node["type"], node["value"]
    if t.endswith("map"):
        out[prefix or "."] = t
        for k, val in v:
            out.update(mp_schema(val, f"{prefix}.{k}"))
    elif "array" in t:
        out[prefix or "."] = f"{t}[{len(v)}]"
        if v:
            out.update(mp_schema(v[0], f"{prefix}[0]"))
    elif t.startswith("bin") and prefix.endswith(".payload"):
        out[prefix] = t
        try:
            inner, end = mp_describe(v)
            if end == len(v):
                out.update(mp_schema(inner, prefix + "<msgpack>"))
        except Exception:
            pass
    else:
        out[prefix or "."] = t
    return out


def mp_get(node, *path):
    for p in path:
        if node is None or not node["type"].endswith("map"):
            return None
        node = next((v for k, v in node["value"] if k == p), None)
    return node


def compact_json(obj) -> str:
    """JSON with one line per entry of the outer two levels."""
    if not isinstance(obj, dict):
        return json.dumps(obj, separators=(",", ":")) + "\n"
    parts = []
    for k, v in obj.items():
        if isinstance(v, dict):
            inner = ",\n  ".join(f"{json.dumps(k2)}: {json.dumps(v2, separators=(',', ':'))}" for k2, v2 in v.items())
            parts.append(f"{json.dumps(k)}: {{\n  {inner}\n }}" if v else f"{json.dumps(k)}: {{}}")
        else:
            parts.append(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}")
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def normalize_wire_type(t: str) -> str:
    """One name per msgpack family: every unsigned int is "uint", every str "str", ..."""
    if t in ("positive_fixint",) or t.startswith("uint"):
        return "uint"
    if t == "negative_fixint" or (t.startswith("int") and t[3:].isdigit()):
        return "int"
    for fam in ("str", "bin", "map"):
        if t == f"fix{fam}" or (t.startswith(fam) and t[len(fam):].isdigit()):
            return fam
    if "array" in t:
        return "array"
    return t


def load_score(subject: str, inner) -> float:
    """How much load a decoded inner payload shows, to pick a loaded example."""

    def num(*path):
        n = mp_get(inner, *path)
        return n["value"] if n is not None and isinstance(n["value"], (int, float)) else 0

    if subject.endswith(".forward-pass-metrics"):
        return 1e6 * num("queued_requests", "num_prefill_requests") + num("scheduled_requests", "sum_decode_kv_tokens") + num(
            "scheduled_requests", "sum_prefill_tokens"
        )
    if subject.endswith(".kv_metrics"):
        return num("kv_used_blocks")
    return 1.0
