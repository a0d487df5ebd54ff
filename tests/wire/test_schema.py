"""Every header field is type- and range-checked where a message arrives (issue 23, item 3):
``remote_magic/wire/schema.py`` refuses what a field may not be with a ProtocolError that names the
message type, the field, what it was and what is allowed; what real peers send passes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from remote_magic.errors import ProtocolError
from remote_magic.wire import serialization
from remote_magic.wire.chunks import CHUNK_BYTES, Outbox
from remote_magic.wire.protocol import PROTOCOL_VERSION, Message, MessageType as T, decode, encode
from remote_magic.wire.schema import HEADERS, check, check_header, describe, job_of
from remote_magic.wire.versions import local_versions


def _raw(msg_type: str, header: bytes) -> Message:
    """A message as it comes off the wire: its header as JSON text (``1e400`` reads as infinity)."""
    return decode([PROTOCOL_VERSION, msg_type.encode(), header])


def _refused(msg: Message, *words: str) -> str:
    with pytest.raises(ProtocolError) as caught:
        check(msg)
    message = str(caught.value)
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize("header", [b'{"ack":1e400}', b'{"ack":-1e400,"resend":true}', b'{"ack":NaN}'])
def test_an_ack_of_1e400_is_refused_naming_it(header: bytes) -> None:
    message = _refused(_raw("link_ack", header), "a link_ack message's `ack` is the number ", "an integer of at least")
    assert "infinity" in message or "NaN" in message


def test_a_chunk_whose_raw_length_is_1e400_is_refused() -> None:
    msg = _raw("chunk", b'{"transfer":"t1","offset":0,"sizes":[3,1,2],"raw":1e400}')
    _refused(msg, "a chunk message's `raw`", "infinity", f"an integer from 0 to {CHUNK_BYTES:,}")
    _refused(_raw("chunk", b'{"transfer":"t1","offset":0,"sizes":[3,1,2],"raw":1073741824}'),
             "`raw` is the integer 1073741824")


@pytest.mark.parametrize("header, field", [
    ({"transfer": "t", "offset": True, "sizes": [3, 1, 2]}, "`offset` is true"),
    ({"transfer": "t", "offset": 0, "sizes": [3, False, 2]}, "`sizes[1]` is false"),
    ({"transfer": "t", "offset": -1, "sizes": [3, 1, 2]}, "`offset` is the integer -1"),
    ({"transfer": "t", "offset": 10**400, "sizes": [3, 1, 2]}, "`offset` is an integer of about 401 digits"),
    ({"transfer": "t", "offset": 1.0, "sizes": [3, 1, 2]}, "`offset` is the number 1.0"),
])
def test_true_is_no_integer_nor_is_a_float_or_one_out_of_range(header: dict[str, Any], field: str) -> None:
    _refused(decode(encode(T.CHUNK, header)), field, "an integer of at least 0")


def test_a_ten_megabyte_job_id_is_refused_without_echoing_it() -> None:
    job = "j" * (10 << 20)
    for msg_type in (T.ATTACH, T.CANCEL, T.SUBMIT, T.RESULT):
        message = _refused(Message(msg_type, {"job": job}), "`job` is a string of 10,485,760 characters",
                           "a string of 1 to 64 characters")
        assert len(message) < 200
    assert job_of({"job": job}) is None and job_of({"job": 7}) is None and job_of({"job": "j1"}) == "j1"


@pytest.mark.parametrize("field, value, said", [
    ("figure_formats", "png", "`figure_formats` is the string 'png'; it must be a list, each item a string"),
    ("figure_formats", ["png", 2], "`figure_formats[1]` is the integer 2"),
    ("keep", {"a": 1}, "`keep` is an object of 1 field; it must be a list"),
    ("versions", [1], "`versions` is a list of 1 item; it must be a JSON object, each key"),
    ("versions", {"numpy": 2}, '`versions["numpy"]` is the integer 2; it must be a string'),
    ("outputs", "x", "`outputs` is the string 'x'; it must be a list"),
    ("text_format", [1], "`text_format` is a list of 1 item"),
    ("text_format", {"pprint": [True]}, '`text_format["pprint"]` is a list of 1 item'),
    ("gpu", "matmul", "`gpu` is the string 'matmul'; it must be true or false, or a list"),
    ("kernels", ["matmul"], "`kernels` is a list of 1 item"),
    ("refs", {"a": {"view": "b", "offset": -8}}, '`refs["a"].offset` is the integer -8'),
    ("names", ["a", 1], "`names[1]` is the integer 1"),
    ("counts", [1, -1], "`counts[1]` is the integer -1"),
    ("kind", "launch", '`kind` is the string \'launch\'; it must be one of "code", "call", "file", "reset"'),
    ("max_result_bytes", float("nan"), "`max_result_bytes` is the number NaN"),
    ("require", [5], "`require` is a list of 1 item; it must be a string of at most 1,024 characters, or a list"),
])
def test_wrong_typed_submit_fields_are_refused_naming_the_field(field: str, value: Any, said: str) -> None:
    _refused(Message(T.SUBMIT, {"job": "j1", "kind": "code", "code": "x = 1", field: value}), "a submit message's",
             said)


def test_what_is_missing_is_named() -> None:
    assert _refused(Message(T.SUBMIT, {"code": "x = 1"}), "a submit message needs `job`: a string of 1 to 64")
    _refused(Message(T.CHUNK, {"transfer": "t", "offset": 0}), "a chunk message needs `sizes`")
    _refused(Message(T.RESULT, {}), "a result message needs `job`")


def test_where_inside_a_value_is_said() -> None:
    _refused(Message(T.HEARTBEAT, {"stats": {"battery": {"percent": float("inf"), "plugged_in": False}}}),
             "a heartbeat message's `stats.battery.percent` is the number 1e400 or more (infinity)",
             "a finite number of at least 0")
    _refused(Message(T.SUBMIT, {"job": "j", "kernels": {"matmul": 3}}), '`kernels["matmul"]` is the integer 3')


def test_every_message_may_carry_a_seq_of_one_or_more() -> None:
    for msg_type in T:
        check(Message(msg_type, _minimal(msg_type.value) | {"seq": 1}))
        _refused(Message(msg_type, _minimal(msg_type.value) | {"seq": 0}), "`seq` is the integer 0")
        _refused(Message(msg_type, _minimal(msg_type.value) | {"seq": True}), "`seq` is true")


def test_unknown_fields_pass_but_known_ones_are_checked() -> None:
    check(Message(T.SUBMIT, {"job": "j1", "from_the_future": {"any": [1e300, None]}}))
    check(Message(T.CANCEL, {"job": "j1", "reason": "fuzz", "x": float("nan")}))


def test_a_timeout_that_is_no_usable_number_is_no_timeout_not_an_error() -> None:
    for timeout in (10**400, float("nan"), float("inf"), -1, 0, None, 2.5):
        check(Message(T.SUBMIT, {"job": "j1", "timeout": timeout}))
    _refused(Message(T.SUBMIT, {"job": "j1", "timeout": "10"}), "`timeout` is the string '10'; it must be a number")


def test_a_client_cannot_name_its_kernel_after_every_kernel() -> None:
    _refused(Message(T.KERNEL_START, {"kernel": "*", "key": "k"}), "`kernel` is the string '*'", "other than '*'")
    _refused(Message(T.KERNEL_STOP, {"kernel": "*", "how": "kill"}), "`kernel` is the string '*'")


def test_every_message_type_has_a_row_and_the_new_delivery_types_too() -> None:
    assert {t.value for t in T} <= set(HEADERS)
    assert {"link_ack", "resume"} <= set(HEADERS)
    check(Message(T.HEARTBEAT, {}))  # types without required fields take an empty header
    _refused(Message(T.HEARTBEAT, {"stats": []}), "`stats` is a list of 0 items; it must be a JSON object")


@pytest.mark.parametrize("header, refused", [
    ({"ack": 3, "resend": True}, None),
    ({"ack": 3, "resend": 1}, "`resend` is the integer 1; it must be true or false"),
    ({"resend": True}, "needs `ack`"),
])
def test_link_ack(header: dict[str, Any], refused: str | None) -> None:
    if refused is None:
        check_header("link_ack", header)
    else:
        with pytest.raises(ProtocolError, match=f"a link_ack message.*{refused}"):
            check_header("link_ack", header)


@pytest.mark.parametrize("header, refused", [
    ({"jobs": ["a" * 64, "b"]}, None),
    ({"jobs": ["a" * 65]}, "a resume message's `jobs[0]` is a string of 65 characters"),
    ({"jobs": [""]}, "`jobs[0]` is the string ''"),
    ({"jobs": "a"}, "`jobs` is the string 'a'; it must be a list, each item a string of 1 to 64 characters"),
    ({}, "a resume message needs `jobs`"),
])
def test_resume_lists_job_ids(header: dict[str, Any], refused: str | None) -> None:
    if refused is None:
        check_header("resume", header)
    else:
        with pytest.raises(ProtocolError) as caught:
            check_header("resume", header)
        assert refused in str(caught.value)


def test_what_real_peers_send_passes() -> None:
    versions = local_versions()
    packed = serialization.pack({"a": np.ones(3), "b": "text"}, one_memo=True)
    submit = {"kind": "code", "code": "c = a", "figure_formats": ["png", "retina"], "outputs": None,
              "text_format": {"pprint": True, "float_precision": "", "max_width": 79, "max_seq_length": 1000},
              "gpu": ["matmul"], "kernels": {"matmul": "@compute ..."}, "require": ["gpu", "memory>=16GB"],
              "prefer": "fastest", "keep": ["c"], "max_result_bytes": 0, "timeout": 3.5, "worker": "box",
              "cached": {"0": "ab" * 16}, "digests": {"1": "cd" * 16}, "shared": "ef" * 16,
              "refs": {"v": {"view": "a", "offset": 8, "shape": [2], "strides": [-8], "dtype": "<f8",
                             "layout": [[3], [8], "float64"], "recarray": False}, "s": {"same": "a"},
                       "i": {"input": 0}, "k": {"copy": "a", "kind": "float64 array"}},
              **packed.header(), "job": "0" * 32, "versions": versions, "session": "f" * 16}
    messages = [
        (T.HELLO, {"role": "worker", "name": "box", "versions": versions, "acks": True, "capabilities": {
            "hostname": "box", "cpu_count": 8, "memory_bytes": 2**34, "speed": 41.5, "battery": None,
            "gpu": {"active": False}, "labels": {"zone": "a"}, "on_battery": "last", "min_battery": 20,
            "kernels": True}}),
        (T.HEARTBEAT, {"stats": {"gpu": {"kernels": {}}, "sessions": {"s": 123}, "max_sessions": 8,
                                 "battery": {"percent": 50, "plugged_in": True},
                                 "kernels": {"k": {"pid": 12, "unacked": 0}}}}),
        (T.SUBMIT, submit),
        (T.SUBMIT, {"kind": "file", "op": {"op": "stat", "path": "x"}, "job": "f1", "names": [], "counts": []}),
        (T.SUBMIT, {"kind": "reset", "job": "r1", "names": [], "counts": [], "versions": versions}),
        (T.STREAM, {"job": "j", "name": "stdout", "text": "hi\n", "seq": 4}),
        (T.DISPLAY, {"job": "j", "data": {"text/plain": "1", "application/json": {"a": [1]}}, "metadata": {},
                     "after_cell": True, "framed": [["image/png", "base64"]]}),
        (T.RESULT, {"job": "j", **packed.header(), "versions": versions, "duration_s": 0.25, "in_place": ["a"],
                    "kept_on_worker": {"m": {"id": "1:m", "type": "x.Y", "why": "kept", "summary": "Y"}},
                    "value_display": {"data": {"text/plain": "1"}, "metadata": {}}, "deleted": ["z"],
                    "refs": {"s": {"same": "a"}}, "files": {"written": {}}, "stats": {"gpu_time_s": 0.1}}),
        (T.ERROR, {"error": "InputError", "message": "no", "name": None, "job": "j"}),
        (T.ERROR, {"error": "ShaderError", "message": "no", "line": 3, "column": None}),
        (T.ERROR, {"error": "ProtocolError", "message": "no", "missing": ["ab" * 16], "job": "j"}),
        (T.KERNEL_START, {"kernel": "k-1", "key": "secret", "signature_scheme": "hmac-sha256", "env": {"A": "1"}}),
        (T.KERNEL_FRAMES, {"kernel": "k-1", "channel": "iopub", "seq": 9}),
        (T.KERNEL_SIGNAL, {"kernel": "k-1", "signum": 2}),
        (T.KERNEL_STOP, {"kernel": "k-1", "how": "orphaned", "reason": "gone"}),
        (T.KERNEL_DIED, {"kernel": "k-1", "exit_code": -9, "reason": "killed"}),
    ]
    for msg_type, header in messages:
        check(decode(encode(msg_type, header)))

    sent: list[list[Any]] = []
    outbox = Outbox(lambda frames: sent.append(frames) or True)
    outbox.put(encode(T.SUBMIT, {"job": "big"}, [bytes(3 << 20)]))
    for frames in sent:
        check(decode(frames))
    assert sent and all(decode(frames).type is T.CHUNK for frames in sent)


def test_values_are_described_briefly() -> None:
    assert describe(None) == "null"
    assert describe(float("-inf")) == "the number -1e400 or less (-infinity)"
    assert describe(10**5000) == "an integer of about 5001 digits"  # str() of it would raise
    assert describe("x" * 41) == "a string of 41 characters"
    assert describe(b"x") == "a bytes"


def _minimal(msg_type: str) -> dict[str, Any]:
    """The fields a type can't go without, well formed."""
    return {name: _WELL_FORMED[name] for name in HEADERS[msg_type].required}


_WELL_FORMED: dict[str, Any] = {"job": "j1", "session": "s1", "transfer": "t1", "offset": 0, "sizes": [3, 1, 2],
                                "received": 0, "ack": 0, "jobs": [], "kernel": "k1"}
