"""The wire format on its own: frames, out-of-band buffers, tokens, version notes, cell analysis."""

from __future__ import annotations

import json

import numpy as np
import pytest

from remote_magic.errors import InputError, OutputError, ProtocolError
from remote_magic.wire import serialization
from remote_magic.wire.cellcode import names_assigned, names_read
from remote_magic.wire.keys import HubKeys
from remote_magic.wire.protocol import MessageType as T, Role, decode, encode
from remote_magic.wire.tokens import Token
from remote_magic.wire.versions import describe_differences


def test_messages_round_trip() -> None:
    msg = decode(encode(T.SUBMIT, {"job": "j1", "code": "x = 1"}, [b"payload"]))
    assert msg.type is T.SUBMIT and msg.header == {"job": "j1", "code": "x = 1"} and msg.buffers == [b"payload"]


def test_oversized_header_is_refused_before_parsing() -> None:
    with pytest.raises(ProtocolError, match="over the 1048576-byte limit"):
        decode([b"RM3", b"submit", b"{" + b" " * (1 << 20) + b"}"])


def test_numpy_buffers_travel_out_of_band_without_a_copy() -> None:
    array = np.random.default_rng(0).standard_normal((512, 512))
    packed = serialization.pack({"a": array, "small": np.arange(3)})
    assert packed.names == ["a", "small"] and packed.counts == [2, 1]
    stream, buffer, _ = packed.frames
    assert len(stream) < 1024  # the pickle stream holds only the array's metadata
    assert np.shares_memory(np.frombuffer(buffer, dtype=array.dtype), array)  # the frame is the array's memory
    back = serialization.unpack(packed.header(), [bytearray(f) for f in packed.frames])
    np.testing.assert_array_equal(back["a"], array)


def test_unpickling_failures_name_the_variable() -> None:
    packed = serialization.pack({"good": 1, "bad": 2})
    frames = list(packed.frames)
    frames[1] = b"not a pickle"
    with pytest.raises(OutputError, match="`bad` can't be loaded here") as info:
        serialization.unpack(packed.header(), frames)
    assert info.value.name == "bad"
    with pytest.raises(OutputError, match="don't match its header"):
        serialization.unpack({"names": ["a"], "counts": [3]}, frames)


def test_unpicklable_input_names_the_variable() -> None:
    with pytest.raises(InputError, match="`gen` \\(generator\\) can't be pickled"):
        serialization.pack({"gen": (i for i in range(2))})


def test_one_memo_keeps_what_several_values_share() -> None:
    inner = np.arange(2000.0)
    d, rows = {"w": inner, "b": [1]}, [[0], [1]]
    packed = serialization.pack({"d": d, "w": inner, "rows": rows, "first": rows[0]}, one_memo=True)
    back = serialization.unpack(packed.header(), packed.frames)
    assert back["w"] is back["d"]["w"] and back["first"] is back["rows"][0]
    np.testing.assert_array_equal(back["w"], inner)
    # One value that can't be pickled: each is pickled on its own, and the others still go.
    packed = serialization.pack({"d": d, "gen": (i for i in range(2)), "w": inner}, one_memo=True,
                                keep_unpicklable=True)
    assert "one_memo" not in packed.header() and list(packed.kept) == ["gen"]
    assert set(serialization.unpack(packed.header(), packed.frames)) == {"d", "w"}


def test_numbered_objects_travel_as_their_number_with_what_they_became() -> None:
    from remote_magic.wire.identity import PATCH_PREFIX, shared_objects

    here = {"d": {"k": [1, 2]}, "t": ([0],)}
    walked = shared_objects(here)
    assert walked is not None
    theirs = serialization.unpack(*(lambda p: (p.header(), p.frames))(serialization.pack(here, one_memo=True)))
    their_walk = shared_objects(theirs)
    assert their_walk is not None and their_walk[1] == walked[1]  # both sides number alike
    theirs["d"]["k"].append(3)

    def number(obj: object) -> int:
        return next(i for i, found in enumerate(their_walk[0]) if found is obj)

    packed = serialization.pack({"d": theirs["d"], "t": theirs["t"]}, shared=their_walk[0])
    assert packed.names == ["d", "t", f"{PATCH_PREFIX}{number(theirs['d']['k'])}",
                            f"{PATCH_PREFIX}{number(theirs['t'][0])}"]  # what the numbered objects are now
    back = serialization.unpack(packed.header(), packed.frames, numbered=walked[0])
    assert back["t"][0] is here["t"][0] and back["d"]["k"] is here["d"]["k"]  # the notebook's own objects
    assert back[f"{PATCH_PREFIX}{number(theirs['d']['k'])}"] == [1, 2, 3]
    with pytest.raises(OutputError, match="refers to object 1 of the cell's inputs"):
        serialization.unpack(packed.header(), packed.frames, numbered=[])


def test_modules_travel_by_name() -> None:
    import json

    packed = serialization.pack({"json": json})
    assert serialization.unpack(packed.header(), packed.frames)["json"] is json
    missing = serialization.pack({"m": serialization.ModuleRef("no_such_module_here")})
    skipped: list[str] = []
    values = serialization.unpack(missing.header(), missing.frames,
                                  on_module_error=lambda name, ref, exc: skipped.append(name))
    assert skipped == ["m"]  # said, and the name stays bound to the reference, for later cells to send back
    assert values == {"m": serialization.ModuleRef("no_such_module_here")} and "on the worker only" in repr(values["m"])


def test_tokens_round_trip_and_redact() -> None:
    keys = HubKeys.generate()
    token = keys.token(Role.CLIENT, "tcp://example.org:5587")
    assert Token.decode(token.encode()) == token
    assert Token.decode(f"%offload_connect {token.encode()}") == token
    assert token.secret.decode() not in token.redacted() and "example.org" in token.redacted()


def test_version_differences_are_explained_in_words() -> None:
    ours = {"remote_magic": "0.1.0", "python": "3.13.0", "cloudpickle": "3.1.2", "numpy": "2.1.3",
            "pandas": "2.2.3", "matplotlib": "3.10.0"}
    theirs = {"remote_magic": "0.2.0", "python": "3.11.7", "cloudpickle": "3.0.0", "numpy": "1.26.4",
              "matplotlib": "3.10.0"}
    notes = describe_differences(ours, theirs, "worker 'box'")
    assert [n.split(" is ")[0] for n in notes] == ["remote-magic", "Python", "numpy", "cloudpickle", "pandas"]
    assert "functions and classes defined in notebook cells travel as source" in notes[1]
    assert "numpy 2 may not load under numpy 1" in notes[2]
    # Missing on the worker: what fails there and how to install it there (no pinned package changes).
    assert notes[4] == ("pandas is 2.2.3 here and not installed on worker 'box': code that imports it fails there. "
                        "Install it there: `pip install pandas` in the Python environment it runs in")
    assert not any("pip install" in note or "one version" in note for note in notes[1:4])  # in Colab: a pinned package
    assert "DataFrames, Series and Index cross" in describe_differences(ours, {**ours, "pandas": "1.5.3"}, "w")[0]
    # Missing here: matplotlib's figures still come back as images.
    [missing_here] = describe_differences({**ours, "matplotlib": ""}, ours, "worker 'box'")
    assert missing_here.startswith("matplotlib is not installed here and is 3.10.0 on worker 'box': figures come back")
    # What doesn't matter isn't said: a Python, cloudpickle or pandas patch release, a numpy minor release.
    assert describe_differences(ours, {**ours, "python": "3.13.9", "numpy": "2.4.0", "cloudpickle": "3.1.3",
                                       "pandas": "2.2.4"}, "w") == []


def test_cell_analysis() -> None:
    cell = "import numpy as np\nc = a @ b\nx[0] = 1\ny.attr = 2\nz += 1\ndef f(q):\n    global g\n    g = q + h\n"
    assert {"a", "b", "x", "y", "z", "h"} <= names_read(cell)
    assert "q" not in names_read(cell)
    assert names_assigned(cell) == ["np", "c", "x", "y", "z", "f", "g"]


def test_every_error_crosses_the_wire_as_itself() -> None:
    from remote_magic import errors
    from remote_magic.wire.failures import error_from_header, error_header

    samples = [cls("it went wrong") for cls in (
        errors.RemoteMagicError, errors.ConnectionFailed, errors.VersionMismatch, errors.PermissionDenied,
        errors.CredentialsRotated, errors.NotConnected, errors.TokenError, errors.ProtocolError,
        errors.SerializationError, errors.JobError, errors.WorkerLost, errors.ExecutorDied, errors.JobCancelled,
        errors.JobTimeout, errors.NoSuchWorker, errors.GpuError, errors.GpuLimitError, errors.TunnelError)]
    samples += [errors.InputError("`x` can't be pickled", "x"), errors.OutputError("`y` can't load", "y"),
                errors.ShaderError("expected ';'", 3, 14),
                errors.RemoteError("ValueError", "bad input 3", "Traceback ...\nValueError: bad input 3\n")]
    for error in samples:
        header = json.loads(json.dumps(error_header(error, "job-1")))  # what actually travels: JSON
        back = error_from_header(header)
        assert isinstance(back, type(error)) and header["job"] == "job-1"
        assert vars(back) == vars(error)
        if isinstance(error, errors.RemoteError):  # and it is the worker's exception type too, named so,
            assert isinstance(back, ValueError) and type(back).__name__ == "ValueError"
            assert str(back) == str(ValueError("bad input 3"))  # and it reads as that type does
        else:
            assert type(back) is type(error) and str(back) == str(error)
    unknown = error_from_header({"error": "SomethingNew", "message": "from a newer peer"})
    assert type(unknown) is errors.RemoteMagicError and str(unknown) == "from a newer peer"
