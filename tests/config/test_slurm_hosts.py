"""Slurm node lists: the grammar, against the examples in Slurm's own documentation (no processes, no torch)."""

from __future__ import annotations

import os
import stat

import pytest

from trainkit.cli.slurm import first_hostname
from trainkit.config.slurm_hosts import expand_slurm_nodelist, first_slurm_host


@pytest.mark.parametrize("nodelist, hosts", [
    # Slurm's hostlist documentation (slurm_hostlist_create(3), Slurm::Hostlist(3pm)).
    ("linux[1-3,6]", ["linux1", "linux2", "linux3", "linux6"]),
    ("node1,node[2-5,12]", ["node1", "node2", "node3", "node4", "node5", "node12"]),
    ("tux[0-5,12,20-25]", [f"tux{n}" for n in (*range(0, 6), 12, *range(20, 26))]),
    ("node21,node[27-34]", ["node21", *(f"node{n}" for n in range(27, 35))]),
    # Whitespace separates expressions too, like a comma.
    ("node1 node[2-3]", ["node1", "node2", "node3"]),
    # Suffixes after a group, several groups (cartesian product, leftmost outermost), zero padding.
    ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("gpu[001-003]", ["gpu001", "gpu002", "gpu003"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
    ("gpu[01-04,07],cpu3", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"]),
    ("rack[1-2]-node[01-02].cluster", ["rack1-node01.cluster", "rack1-node02.cluster", "rack2-node01.cluster",
                                       "rack2-node02.cluster"]),
    ("[1-2]", ["1", "2"]),
    ("host-a.example.org", ["host-a.example.org"]),
])
def test_documented_and_hard_nodelists_expand_in_order(nodelist, hosts):
    assert expand_slurm_nodelist(nodelist) == hosts
    assert first_slurm_host(nodelist) == hosts[0]


@pytest.mark.parametrize("nodelist", [
    "", "   ", "bgl[123x456]", "node[1-", "node1-2]", "node[[1-2]]", "node[]", "node[2-1]", "node[a-c]",
    "node[1-2,]", ",node1", "node1,,node2", "node1,", "nöde1", "node[1-2]/x",
])
def test_anything_not_fully_parsed_is_none(nodelist):
    assert expand_slurm_nodelist(nodelist) is None
    assert first_slurm_host(nodelist) is None


def test_first_host_of_a_huge_list_costs_nothing():
    assert first_slurm_host("n[0000001-9999999]x[1-9999999]") == "n0000001x1"


def test_scontrol_decides_what_the_parser_does_not_cover(tmp_path, monkeypatch):
    """CPU only: a stand-in ``scontrol`` on PATH answers for a Blue Gene prism; a parsed list never asks it."""
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\necho \"asked $*\" >> \"$(dirname \"$0\")/calls\"\necho bgl123\necho bgl124\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert first_hostname("bgl[123x456]") == "bgl123"
    assert first_hostname("node[1-2]-ib") == "node1-ib"
    assert (tmp_path / "calls").read_text().splitlines() == ["asked show hostnames bgl[123x456]"]
