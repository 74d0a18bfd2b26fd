"""Tests of :class:`hw.config.NPUConfig`: its checks and its JSON form."""

import pytest

from hw.config import BUS_WIDTHS, NPUConfig, default_bus_width


@pytest.mark.parametrize("config", [
    NPUConfig(),
    NPUConfig.from_name("1x1", spad_depth=1, acc_depth=1, bus_width=32),
    NPUConfig.from_name("3x5", bus_width=128),
    NPUConfig(rows=256, cols=256, spad_depth=65536, acc_depth=65536, bus_width=64),
    NPUConfig.from_name("4x4", bus_width=256),
    NPUConfig.from_name("8x4", bus_width=512),
    NPUConfig.from_name("16x16"),
    NPUConfig.from_name("32x32"),
    NPUConfig.from_name("64x2"),
], ids=lambda config: config.key())
def test_json_round_trip(config):
    assert NPUConfig.from_json(config.to_json()) == config


def test_json_names_every_field():
    text = NPUConfig.from_name("3x5", spad_depth=100, acc_depth=7, bus_width=128).to_json()
    assert text == ('{"rows": 3, "cols": 5, "spad_depth": 100, "acc_depth": 7, '
                    '"bus_width": 128, "addr_width": 32}')


def test_json_left_out_fields_take_their_defaults():
    assert NPUConfig.from_json('{"rows": 4, "cols": 2}') == NPUConfig(rows=4, cols=2)
    assert NPUConfig.from_json("{}") == NPUConfig()


@pytest.mark.parametrize("text, match", [
    ('{"rows": 4,', r"must be given as a JSON object, but '\{\"rows\": 4,' is not JSON"),
    ("", "is not JSON"),
    ("[4, 4]", r"must be given as a JSON object, not '\[4, 4\]'"),
    ('"4x4"', "must be given as a JSON object"),
    ('{"rows": 4, "colz": 4, "depth": 1}',
     "unknown NPUConfig fields colz, depth in .*; the fields are rows, cols, spad_depth, "
     "acc_depth, bus_width, addr_width"),
    ('{"rows": 0}', r"rows must be a positive integer, not 0 \(in the NPUConfig"),
    ('{"rows": 2.5}', "rows must be an integer, not 2.5"),
    ('{"bus_width": 64.0}', "bus_width must be an integer, not 64.0"),
    ('{"acc_depth": true}', "acc_depth must be an integer, not True"),
    ('{"bus_width": 48}', "bus_width must be one of 32, 64, 128, 256, 512, not 48"),
    ('{"bus_width": 1024}', "bus_width must be one of 32, 64, 128, 256, 512, not 1024"),
    ('{"addr_width": 64}', "addr_width must be 32, not 64"),
])
def test_json_errors(text, match):
    with pytest.raises(ValueError, match=match):
        NPUConfig.from_json(text)


def test_json_must_be_text():
    with pytest.raises(ValueError, match="JSON object in a str, not 5"):
        NPUConfig.from_json(5)


@pytest.mark.parametrize("field_name, value", [
    ("bus_width", 64.0), ("addr_width", 32.0), ("rows", True), ("spad_depth", "2048")])
def test_fields_must_be_integers(field_name, value):
    with pytest.raises(ValueError, match=f"{field_name} must be an integer, not {value!r}"):
        NPUConfig(**{field_name: value})


@pytest.mark.parametrize("rows, bus_width", [
    (1, 64), (7, 64), (8, 64), (9, 128), (16, 128), (17, 256), (32, 256), (33, 512), (64, 512),
    (65, 512), (256, 512)])
def test_default_bus_width_carries_an_activation_row_a_beat(rows, bus_width):
    """8 x rows bits rounded up to a power of two, at least 64, at most 512; the columns do
    not count."""
    assert default_bus_width(rows) == bus_width
    for cols in (1, rows, 256):
        config = NPUConfig(rows=rows, cols=cols)
        assert config.bus_width == bus_width
        assert config.key().endswith(f"_b{bus_width}")
    assert NPUConfig.from_name(f"{rows}x3").bus_width == bus_width
    assert NPUConfig.from_json(f'{{"rows": {rows}}}').bus_width == bus_width
    assert NPUConfig(rows=rows, bus_width=None).bus_width == bus_width


@pytest.mark.parametrize("bus_width", BUS_WIDTHS)
@pytest.mark.parametrize("name", ["1x1", "8x8", "16x16", "32x32", "64x64"])
def test_explicit_bus_width_stays(name, bus_width):
    config = NPUConfig.from_name(name, bus_width=bus_width)
    assert config.bus_width == bus_width and config.bus_bytes == bus_width // 8
    assert NPUConfig.from_json(config.to_json()) == config


def test_default_bus_width_names_its_build():
    """A config given no bus width writes the width it took into its JSON form and its key:
    the 16x16 default (128) and an explicit 64 are different builds."""
    default = NPUConfig.from_name("16x16")
    assert '"bus_width": 128' in default.to_json()
    assert default == NPUConfig.from_name("16x16", bus_width=128)
    assert default.key() == "16x16_s2048_a512_b128"
    assert default.key() != NPUConfig.from_name("16x16", bus_width=64).key()
    assert NPUConfig.from_json(default.to_json()).key() == default.key()
    assert BUS_WIDTHS == (32, 64, 128, 256, 512)
