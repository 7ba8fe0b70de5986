"""GPU specs and calibrated profiles."""

from __future__ import annotations

import errno
import io
import json
import os

import pytest

from pipetune.model import hardware
from pipetune.model.hardware import HardwareError, get_gpu, gpu_keys


def test_registry_covers_the_product_gpus():
    assert {"a100", "h100", "h200"} <= set(gpu_keys())
    assert get_gpu("H100-SXM5-80GB", calibrated=False).key == "h100"
    with pytest.raises(HardwareError, match="unknown GPU 'v100'"):
        get_gpu("v100")


def test_spec_sheet_peaks(a100, h100):
    # The spec values reproduce the vendors' dense FP16 tensor figures.
    assert a100.peak_tensor_tflops == pytest.approx(312, rel=0.01)
    assert h100.peak_tensor_tflops == pytest.approx(989.4, rel=0.01)
    assert get_gpu("h200", calibrated=False).dram_bandwidth_gbs > h100.dram_bandwidth_gbs


def test_profile_overrides_and_validation(tmp_path, h100):
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps({"gpu": "h100", "overrides": {"dram_bandwidth_gbs": 3000, "sm_count": 132.0}})
    )
    spec = get_gpu("h100", profile=path, calibrated=False)
    assert spec.dram_bandwidth_gbs == 3000.0
    assert isinstance(spec.sm_count, int)
    assert spec.profile == "profile:p.json"
    assert h100.dram_bandwidth_gbs == 3350.0  # the registry itself is untouched

    for bad, message in (
        ({"overrides": {"warp_speed": 1}}, "unknown field 'warp_speed'"),
        ({"overrides": {"sm_count": -1}}, "must be positive"),
        ({"overrides": {"sm_count": "many"}}, "must be a number"),
        # Rounded down to 0 SMs: the model divided by zero (an OverflowError, or NaN times).
        ({"overrides": {"sm_count": 0.5}}, "'sm_count' must be a whole number, got 0.5"),
        ({"overrides": {"arch": 1}}, "may not override 'arch'"),
        # Accepted: the model then overflowed in every command on the GPU (a bare
        # OverflowError), or predicted 7e297 us.
        ({"overrides": {"sm_count": 1e20}}, "'sm_count' is 1e\\+20, more than 100 times off"),
        ({"overrides": {"dram_bandwidth_gbs": 1e-300}}, "more than 100 times off the spec"),
        # The CLI read "unknown GPU" as its --gpu option's, which the user had typed right.
        ({"gpu": "h9000", "overrides": {}}, "p.json: 'gpu': unknown GPU 'h9000'"),
        ({"gpu": "a100", "overrides": {}}, "is for 'a100'"),
        ({"gpu": "h100"}, "needs an 'overrides' object"),
    ):
        path.write_text(json.dumps(bad))
        with pytest.raises(HardwareError, match=message):
            get_gpu("h100", profile=path, calibrated=False)
    path.write_text("{not json")
    with pytest.raises(HardwareError, match="not valid JSON"):
        get_gpu("h100", profile=path)
    # Nested past the decoder's recursion: a RecursionError (the CLI's exit 1) before.
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(HardwareError, match="not valid JSON: nested too deeply"):
        get_gpu("h100", profile=path)
    # A directory was an IsADirectoryError (the CLI's exit 1), bytes a UnicodeDecodeError.
    with pytest.raises(HardwareError, match="is a directory, not a JSON file"):
        get_gpu("h100", profile=tmp_path)
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(HardwareError, match="cannot be read"):
        get_gpu("h100", profile=path)
    # An endless device was read whole: a MemoryError (exit 1) after all the memory was taken.
    import os

    if os.path.exists("/dev/zero"):
        with pytest.raises(HardwareError, match="holds more than 16 MiB: not a hardware"):
            get_gpu("h100", profile="/dev/zero")


def test_committed_profile_is_applied_automatically(tmp_path, monkeypatch):
    (tmp_path / "a100.json").write_text(
        json.dumps({"gpu": "a100", "overrides": {"l2_latency_ns": 111}})
    )
    monkeypatch.setattr(hardware, "PROFILE_DIR", tmp_path)
    assert get_gpu("a100").l2_latency_ns == 111.0
    assert get_gpu("a100").profile == "calibrated:a100.json"
    assert get_gpu("a100", calibrated=False).l2_latency_ns != 111.0


def test_a_users_own_profile_is_applied_before_the_shipped_one(tmp_path, monkeypatch):
    # Installed, the shipped profiles live in site-packages, which an upgrade replaces: a
    # user's calibration lives in the user's profile folder, and the model reads it first.
    shipped, own = tmp_path / "shipped", tmp_path / "own"
    shipped.mkdir()
    own.mkdir()
    (shipped / "a100.json").write_text(
        json.dumps({"gpu": "a100", "overrides": {"l2_latency_ns": 111}})
    )
    monkeypatch.setattr(hardware, "PROFILE_DIR", shipped)
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(own))
    assert get_gpu("a100").profile == "calibrated:a100.json"
    (own / "a100.json").write_text(
        json.dumps({"gpu": "a100", "overrides": {"dram_latency_ns": 777}})
    )
    spec = get_gpu("a100")
    # The user's profile replaces the shipped one (it measured the same fields), not stacks.
    assert spec.profile == "calibrated(user):a100.json" and spec.dram_latency_ns == 777.0
    assert spec.l2_latency_ns == get_gpu("a100", calibrated=False).l2_latency_ns
    assert hardware.applied_profile("a100") == (own / "a100.json", "calibrated(user):a100.json")
    assert get_gpu("a100", calibrated=False).profile != spec.profile


def test_without_the_users_profile_the_shipped_one_is_applied(tmp_path, monkeypatch):
    # Data committed with pipetune was measured on the shipped profile's device: evaluated
    # with the user's own profile, the model took the user's device for the one that ran it.
    shipped, own = tmp_path / "shipped", tmp_path / "own"
    shipped.mkdir()
    own.mkdir()
    for folder, latency in ((shipped, 111), (own, 777)):
        (folder / "a100.json").write_text(
            json.dumps({"gpu": "a100", "overrides": {"l2_latency_ns": latency}})
        )
    monkeypatch.setattr(hardware, "PROFILE_DIR", shipped)
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(own))
    assert get_gpu("a100").l2_latency_ns == 777.0
    spec = get_gpu("a100", user_profile=False)
    assert spec.l2_latency_ns == 111.0 and spec.profile == "calibrated:a100.json"


def test_the_users_profile_folder_is_beside_the_embedded_database(tmp_path, monkeypatch):
    monkeypatch.delenv(hardware.USER_PROFILE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert hardware.user_profile_dir() == tmp_path / "pipetune" / "profiles"
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(tmp_path / "mine"))
    assert hardware.user_profile_dir() == tmp_path / "mine"


def test_a_profile_is_read_once_per_version_of_its_file(tmp_path, monkeypatch):
    """A worker registration calls get_gpu: read from disk on each call, a registration made
    with every file descriptor taken (EMFILE at the hard limit) answered 500. A second call
    opens no file; a profile rewritten since (calibrate and unpack write a new file and
    rename it over the old one) is read afresh."""
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(hardware, "PROFILE_DIR", shipped)
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(tmp_path / "own"))
    (shipped / "a100.json").write_text(
        json.dumps({"gpu": "a100", "overrides": {"l2_latency_ns": 111}})
    )
    assert get_gpu("a100").l2_latency_ns == 111.0

    def no_descriptor(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    with monkeypatch.context() as at_the_limit:
        at_the_limit.setattr(io, "open", no_descriptor)
        at_the_limit.setattr("builtins.open", no_descriptor)
        spec = get_gpu("a100")
        assert spec.l2_latency_ns == 111.0 and spec.profile == "calibrated:a100.json"
        # Each caller gets its own overrides: one that changed them changes no other's.
        hardware.load_profile(shipped / "a100.json")[1].clear()
        assert get_gpu("a100").l2_latency_ns == 111.0

    staged = shipped / "a100.json.tmp"
    staged.write_text(json.dumps({"gpu": "a100", "overrides": {"l2_latency_ns": 222}}))
    os.replace(staged, shipped / "a100.json")
    assert get_gpu("a100").l2_latency_ns == 222.0


def test_a_profile_in_the_profile_folder_that_measured_another_gpu_is_refused(
    tmp_path, monkeypatch
):
    """<key>.json is picked by its name: an H200 profile copied to h100.json was applied to
    the H100 (its DRAM bandwidth, clock and L2), as an explicit --profile of it is not."""
    own = tmp_path / "own"
    own.mkdir()
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(own))
    (own / "h100.json").write_text(
        json.dumps({"gpu": "h200", "overrides": {"dram_bandwidth_gbs": 3832.6}})
    )
    with pytest.raises(HardwareError, match=r"h100\.json is for 'h200', not 'h100'"):
        get_gpu("h100")
    # A profile that names no GPU is still the file's name's.
    (own / "h100.json").write_text(json.dumps({"overrides": {"dram_bandwidth_gbs": 3100}}))
    assert get_gpu("h100").dram_bandwidth_gbs == 3100.0


def test_a_refused_field_of_a_profile_applied_by_itself_names_its_file(tmp_path, monkeypatch):
    # Every command naming the GPU failed with "profile field 'dram_bandwidth_gbs' must be
    # positive": no word of which file, and the user never passed one.
    own = tmp_path / "own"
    own.mkdir()
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(own))
    (own / "h100.json").write_text(json.dumps({"gpu": "h100", "overrides": {"sm_count": -1}}))
    with pytest.raises(HardwareError) as refused:
        get_gpu("h100")
    assert str(refused.value) == (
        f"profile {own / 'h100.json'}: profile field 'sm_count' must be positive, got -1"
    )
