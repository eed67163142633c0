"""placecheck.basics.values: the one grammar of sizes, devices and sites, read once at the edge."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from placecheck.basics.errors import UsageError
from placecheck.basics.values import Device, Site, Size

pytestmark = pytest.mark.cpu_build


@pytest.mark.parametrize(("text", "expected"), [
    ("80GiB", 80 * 2**30), ("24GB", 24 * 10**9), ("24g", 24 * 10**9), ("512M", 512 * 10**6),
    ("512miB", 512 * 2**20), ("1.5GiB", 3 * 2**29), ("100B", 100), ("100 B", 100),
    ("2 TiB", 2 * 2**40),
    ("2K", 2000), ("2Ki", 2048),
])
def test_a_size_has_one_grammar(text: str, expected: int) -> None:
    assert Size.parse(text) == Size(expected)


@pytest.mark.parametrize("text", [
    "80", "1000000", "80i", "iB", "GiB", "80GiBs", "eighty GiB", "0GiB", "-1GiB", "", "24Gb", "100b", "8GIB",
])
def test_a_size_without_its_unit_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match=r"--gpu-memory .*: expected a size"):
        Size.parse(text, "--gpu-memory")


@pytest.mark.parametrize(("n", "shown"), [
    (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (3 * 2**30, "3.0 GiB"), (5 * 2**40, "5.0 TiB"),
])
def test_a_size_prints_in_binary_units(n: int, shown: str) -> None:
    assert str(Size(n)) == shown


@pytest.mark.parametrize(("text", "device"), [
    ("cuda", Device("cuda", 0)), ("CUDA:3", Device("cuda", 3)), ("cpu", Device("cpu")),
    ("cpu:0", Device("cpu")),
    ("mps", Device("mps", 0)), ("meta", Device("meta")),
])
def test_a_device_is_read_as_tensors_name_it(text: str, device: Device) -> None:
    parsed = Device.parse(text)
    assert parsed == device
    assert Device.parse(str(parsed)) == parsed


@pytest.mark.parametrize("text", ["gpu", "cuda:x", "cpu:1", "cuda:", ""])
def test_an_unknown_device_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="unknown device"):
        Device.parse(text)


def test_a_device_torch_wrote_is_read_leniently() -> None:
    assert Device.of("cuda:3") == Device("cuda", 3) and Device.of("cuda").ordinal == 0
    assert Device.of("xpu:1") == Device("xpu", 1) and Device.of("cpu").ordinal == 0
    assert Device.of("disk") == "disk" and Device.of("cuda:2").type == "cuda"


def test_a_device_is_only_made_in_its_normal_form() -> None:
    assert Device("cuda") == "cuda:0" and Device("cpu", 0) == "cpu" and Device("mps").ordinal == 0
    for text in ("cuda:0", ""):
        with pytest.raises(ValueError, match=r"Device\.of"):
            Device(text)


@pytest.mark.parametrize("device", [Device("cuda", 1), Device("cpu"), Device.of("disk")])
def test_a_device_reads_as_the_text_of_the_json_contract(device: Device) -> None:
    """A str: JSON, a user's ``finding.device == "cuda:1"`` and a quoted message read the text; pickled
    (the fork server's replies) and copied (``dataclasses.asdict``), it stays a Device of that text."""
    text = str(device)
    assert device == text and hash(device) == hash(text) and json.loads(json.dumps([device])) == [text]
    assert repr(device) == repr(text) and f"{device}" == text and type(device.type) is str
    for again in (pickle.loads(pickle.dumps(device)), copy.deepcopy(device), copy.copy(device)):
        assert type(again) is Device and again == device


@pytest.mark.parametrize(("text", "site"), [
    ("net.py:12", Site("net.py", 12)), ("pkg/net.py", Site("pkg/net.py")),
    (r"C:\work\net.py:7", Site(r"C:\work\net.py", 7)), (r"C:\work\net.py", Site(r"C:\work\net.py")),
    ("net.py:", Site("net.py:")), (":12", Site(":12")),
])
def test_a_site_is_path_and_line(text: str, site: Site) -> None:
    assert Site.parse(text) == site
    assert str(site) == text or site.line is None


@pytest.mark.parametrize("site", [Site("pkg/net.py", 12), Site(), Site.parse(r"C:\work\net.py")])
def test_a_site_reads_as_the_text_of_the_json_contract(site: Site) -> None:
    """A finding's ``source`` is the text it always was; pickled and copied, it stays a Site with its
    path and line."""
    text = str(site)
    assert site == text and json.loads(json.dumps([site])) == [text] and repr(site) == repr(text)
    assert Site.parse(text) == site and Site.parse(site) is site
    for again in (pickle.loads(pickle.dumps(site)), copy.deepcopy(site)):
        assert type(again) is Site and (again.path, again.line) == (site.path, site.line)


def test_devices_sort_gpus_by_index_then_the_rest_by_name() -> None:
    from placecheck.basics.values import device_order

    devices = ["meta", "cpu", "cuda:10", "disk", "cuda:2", "cuda:0"]
    assert sorted(devices, key=device_order) == ["cuda:0", "cuda:2", "cuda:10", "cpu", "disk", "meta"]
