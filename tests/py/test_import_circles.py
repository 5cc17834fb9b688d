"""No import circles between the modules of a crate
(scripts/import-circles.py): every workspace crate is clean and keeps the
module order its root doc comment states (host/src/lib.rs states one);
the check finds a circle planted in a small synthetic crate, through a
re-export, while comments, strings, test modules and a folder's own parts
make no edge, and finds a use against a stated order."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("import_circles", ROOT / "scripts" / "import-circles.py")
ic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ic)


def crate(tmp: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        f = tmp / "src" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp


def names(tmp: Path, found) -> list[list[str]]:
    return [sorted(str(f.relative_to(tmp / "src")) for f in group) for group in found]


def test_the_workspace_has_no_import_circle():
    members = ic.members()
    assert len(members) >= 8, members
    edges = 0
    for d in members:
        found, graph = ic.crate_circles(d)
        assert not found, f"import circles in {d}: {names(d, found)}"
        edges += sum(len(ts) for ts in graph.values())
    # The check reads imports at all (a parser that read none would pass).
    assert edges > 100, edges


def test_host_src_keeps_its_stated_module_order():
    host = ROOT / "host"
    order = ic.stated_order(host)
    assert order and order[0] == "spread" and order[-1] == "cli", order
    assert ic.order_violations(host) == []
    # The order is not empty talk: the modules do use earlier ones.
    uses = ic.top_edges(host)
    assert "engine" in uses["scheduler"] and "speculation" in uses["sequence"], uses


def test_a_use_against_the_stated_order_is_found(tmp_path):
    d = crate(tmp_path, {
        "lib.rs": "//! Module order (each uses only those before it): `a`, `b`.\npub mod a;\npub mod b;\npub mod c;\n",
        "a.rs": "pub fn f() { crate::b::g(); }\n",
        "b.rs": "pub fn g() {}\n",
        "c.rs": "",
    })
    assert ic.stated_order(d) == ["a", "b"]
    assert ic.order_violations(d) == ["the order leaves out c", "a uses b (g), which comes after it"]


def test_a_planted_circle_is_found_through_a_reexport(tmp_path):
    d = crate(tmp_path, {
        "lib.rs": "pub mod a;\npub mod b;\npub mod c;\n",
        "a.rs": "use crate::b::Thing;\npub fn g() -> Thing { Thing }\n",
        "b/mod.rs": "mod inner;\npub use inner::Thing;\n",
        # The edge back, in an expression path.
        "b/inner.rs": "pub struct Thing;\nfn f() { let _ = crate::a::g(); }\n",
        "c.rs": "use crate::a::g;\n",
    })
    found, graph = ic.crate_circles(d)
    assert names(d, found) == [["a.rs", "b/inner.rs"]]
    assert graph[d / "src" / "a.rs"][d / "src" / "b" / "inner.rs"] == {"Thing"}


def test_comments_strings_tests_and_a_folder_s_parts_make_no_edge(tmp_path):
    d = crate(tmp_path, {
        "lib.rs": "pub mod a;\npub mod b;\n",
        "a.rs": "use crate::b::{Own, Thing};\n",
        "b/mod.rs": (
            "pub mod part;\npub use part::Thing;\npub struct Own;\n"
            "// crate::a::x\n/* use crate::a; */\nconst S: &str = \"crate::a::y\";\n"
            "#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n"
        ),
        # A part uses its folder's item: not a circle between modules.
        "b/part.rs": "use super::Own;\npub struct Thing(Own);\n",
    })
    found, _ = ic.crate_circles(d)
    assert found == []
    # The same crate with the edge back written in code is a circle.
    (d / "src" / "b" / "mod.rs").write_text("pub mod part;\npub use part::Thing;\npub struct Own;\nuse crate::a;\n")
    found, _ = ic.crate_circles(d)
    assert names(d, found) == [["a.rs", "b/mod.rs"]]
