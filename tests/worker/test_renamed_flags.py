"""A remote-worker flag renamed so that its word has one meaning still takes its former name, unlisted
(docs/architecture.md, "Names kept for users and for the wire")."""

from __future__ import annotations

from remote_magic.worker.cli import build_parser


def test_kernels_is_the_former_name_of_jupyter_kernels_and_the_help_lists_only_the_new_one() -> None:
    parser = build_parser()
    assert parser.parse_args([]).jupyter_kernels == "on"
    assert parser.parse_args(["--jupyter-kernels", "off"]).jupyter_kernels == "off"
    assert parser.parse_args(["--kernels", "off"]).jupyter_kernels == "off"
    shown = parser.format_help()
    assert "--jupyter-kernels" in shown and "--kernels" not in shown.replace("--jupyter-kernels", "")
