"""The campaign report in a real headless Chromium (issue 18, item 3). Slow: run by .ci/run.

A two-round demo campaign with a fault (the daemon SIGKILLs itself in round 1's TRAIN, and a
second ``shoprld run`` resumes it) is reported with ``shoprld report``; then Debian's
``chromium`` (no CDP, plain flags) loads the page:

- with ``--enable-logging=stderr``: no ``CONSOLE`` line (the page has no script; any console
  message is an error such as a blocked resource);
- with ``--log-net-log``: the page requested nothing but its own file (Chromium's own
  background calls to its update and account services are filtered out by host);
- one screenshot per plot (``report.html#plot-NAME`` shows that plot alone, by CSS
  ``:target``): the plot region holds coloured (saturated) pixels, which axes, ticks and
  labels (black and grey) never are, so an empty plot fails.

- at a phone's 390x844 and a desktop's 1280x900: no horizontal overflow (the document's
  ``scrollWidth`` is not wider than its viewport; a plot or a table may pan inside its own box).
  Headless Chromium will not make a window narrower than 500 px, so the page is measured and
  shot inside an iframe of exactly the viewport's size, by a harness page (the report itself has
  no script); the phone shot is cropped to the iframe.

The campaign also has a trainer that crashes once (``DEMO_CRASH_AT``): a failed attempt with its
cause and bundle for the page's header. Each detector is checked against a page built to trip
it, so none passes vacuously. ``SHOPRLD_REPORT_SHOTS=DIR`` keeps the screenshots in DIR.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from shoprld.daemon.ops import report
from tests.demotree import SHOPRLD, journal, kill_tree_leftovers, make_tree, run_daemon

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Chromium's own background traffic (component updates, time, accounts); never the page's.
CHROMIUM_OWN = re.compile(r"^https?://([^/]*\.)?(google\.com|googleapis\.com|gvt1\.com|gstatic\.com)(/|$)")
MIN_COLOURED = 400  # saturated pixels a plot must hold
VIEWPORTS = {"phone": (390, 844), "desktop": (1280, 900)}
MIN_WINDOW = 500  # headless Chromium's narrowest window
# Measures the iframe's document once it has loaded: its scroll width against its viewport, and
# the first elements that stick out of the viewport without a scrolling box around them.
PROBE = """<script>
document.getElementById("f").addEventListener("load", function () {
  var win = this.contentWindow, doc = this.contentDocument, s = doc.scrollingElement, w = win.innerWidth, out = [];
  function clipped(e) {
    for (var p = e.parentElement; p && p !== doc.body; p = p.parentElement) {
      if (win.getComputedStyle(p).overflowX !== "visible") return true;
    }
    return false;
  }
  doc.querySelectorAll("body *").forEach(function (e) {
    var r = e.getBoundingClientRect();
    if (r.right > w + 1 && out.length < 5 && !clipped(e)) out.push(e.tagName + " " + (e.id || "") + " right=" + r.right);
  });
  document.documentElement.setAttribute("data-probe", JSON.stringify({sw: s.scrollWidth, cw: s.clientWidth, iw: w,
                                                                      out: out}));
});
</script>"""


def _harness(page: Path, tmp: Path, width: int, height: int) -> Path:
    """A page holding ``page`` in an iframe of exactly width x height, with the overflow probe."""
    out = tmp / f"harness-{width}x{height}-{page.stem}.html"
    out.write_text(f'<!DOCTYPE html><html><body style="margin:0"><iframe id=f src="{page.as_uri()}" '
                   f'style="border:0;display:block;width:{width}px;height:{height}px"></iframe>{PROBE}</body></html>')
    return out


def _overflow(page: Path, tmp: Path, width: int, height: int) -> dict[str, object]:
    """What the probe measured at that viewport: sw (scrollWidth), cw (clientWidth), iw, out."""
    harness = _harness(page, tmp, width, height)
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-extensions",
            "--allow-file-access-from-files", f"--user-data-dir={tmp / 'probe.profile'}",
            f"--window-size={max(width, MIN_WINDOW)},{height}", "--dump-dom", harness.as_uri()]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    m = re.search(r'data-probe="([^"]*)"', res.stdout)
    assert m, f"the probe did not run ({res.returncode}): {res.stderr[-2000:]}"
    return dict(json.loads(html.unescape(m.group(1))))


def _viewport_shot(page: Path, png: Path, tmp: Path, width: int, height: int) -> None:
    """A screenshot of ``page`` at width x height (through the harness; cropped to the iframe)."""
    _chromium(_harness(page, tmp, width, height).as_uri(), png, tmp, size=f"{max(width, MIN_WINDOW)},{height}",
              extra=["--allow-file-access-from-files"])
    from PIL import Image

    with Image.open(png) as im:
        im.crop((0, 0, width, height)).save(png)


def _chromium(url: str, png: Path, tmp: Path, *, size: str = "1100,800",
              extra: list[str] | None = None) -> tuple[str, list[str]]:
    """Load ``url`` headless; returns (stderr, every URL the network log saw)."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    netlog = tmp / f"{png.stem}.netlog.json"
    profile = tmp / f"{png.stem}.profile"
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
            f"--log-net-log={netlog}", f"--window-size={size}", f"--screenshot={png}", *(extra or []), url]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert png.exists(), f"no screenshot ({res.returncode}): {res.stderr[-2000:]}"
    urls = re.findall(r'"url":"([^"]+)"', netlog.read_text(errors="replace")) if netlog.exists() else []
    return res.stderr, urls


def _console_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln]


def _page_requests(urls: list[str], page: str) -> list[str]:
    return sorted({u for u in urls if not CHROMIUM_OWN.match(u) and u.split("#")[0] != page})


def _coloured(png: Path) -> int:
    from PIL import Image

    raw = Image.open(png).convert("RGB").tobytes()
    return sum(1 for i in range(0, len(raw), 3) if max(raw[i:i + 3]) - min(raw[i:i + 3]) > 60)


@pytest.fixture(scope="module")
def faulted_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("matplotlib")
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    root = tmp_path_factory.mktemp("rep")
    campaign = make_tree(root, rounds=2)
    kill_dir = root / "kill"
    kill_dir.mkdir()
    try:
        # The trainer crashes once at rollout 5 (round 0: a failed attempt, its cause and bundle, a
        # retry); then the daemon SIGKILLs itself in round 1's TRAIN.
        first = run_daemon(campaign, env={"SHOPRLD_TEST_KILL": "TRAIN:mid:1", "SHOPRLD_TEST_KILL_DIR": str(kill_dir),
                                          "DEMO_CRASH_AT": "5", "DEMO_FAULT_ONCE_DIR": str(kill_dir)})
        assert first.returncode == -9, first.stderr[-2000:]
        second = run_daemon(campaign)
        assert second.returncode == 0, second.stderr[-2000:]
    finally:
        kill_tree_leftovers(root)
    assert any(r["event"] == "transition" and r.get("trigger") == "resume" for r in journal(root))
    out = root / "report.html"
    res = subprocess.run([*SHOPRLD, "report", "-c", str(campaign), "-o", str(out)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == f"wrote {out}", res.stderr
    return out


def _keep(png: Path) -> None:
    dest = os.environ.get("SHOPRLD_REPORT_SHOTS")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(dest) / png.name)


def test_page_loads_with_no_console_message_and_no_request(faulted_report: Path, tmp_path: Path) -> None:
    """The whole report renders in Chromium with no console message and fetches nothing."""
    url = faulted_report.as_uri()
    png = tmp_path / "report-full.png"
    stderr, urls = _chromium(url, png, tmp_path, size="1200,3200")
    _keep(png)
    assert _console_lines(stderr) == []
    assert _page_requests(urls, url) == []
    assert _coloured(png) > 4 * MIN_COLOURED
    page = faulted_report.read_text()
    assert "daemon crash (resumed)" in page  # the fault is on the timeline


@pytest.mark.parametrize("plot", report.PLOTS)
def test_every_plot_is_present_and_not_empty_in_a_screenshot(faulted_report: Path, tmp_path: Path,
                                                             plot: str) -> None:
    """Each plot, shown alone, holds coloured pixels: data, not only axes and labels."""
    png = tmp_path / f"report-plot-{plot}.png"
    stderr, _ = _chromium(f"{faulted_report.as_uri()}#plot-{plot}", png, tmp_path, size="1100,700")
    _keep(png)
    assert _console_lines(stderr) == []
    assert _coloured(png) >= MIN_COLOURED, f"{plot}: looks empty"


def test_the_detectors_trip_on_pages_built_to_trip_them(tmp_path: Path) -> None:
    """A console.error, an external image and an empty plot are each caught: the checks can fail."""
    pytest.importorskip("matplotlib")
    noisy = tmp_path / "noisy.html"
    noisy.write_text('<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png">'
                     '<script>console.error("shoprld-canary")</script></body></html>')
    stderr, urls = _chromium(noisy.as_uri(), tmp_path / "noisy.png", tmp_path, size="400,300")
    assert any("shoprld-canary" in ln for ln in _console_lines(stderr))
    assert _page_requests(urls, noisy.as_uri()) == ["http://127.0.0.1:9/x.png"]
    empty = report.ReportData(campaign="c", experiment="e", rounds=2, state="TRAIN")
    page = tmp_path / "empty.html"
    page.write_text(report.render(empty))
    for plot in report.PLOTS:
        png = tmp_path / f"empty-{plot}.png"
        _chromium(f"{page.as_uri()}#plot-{plot}", png, tmp_path, size="1100,700")
        assert _coloured(png) < MIN_COLOURED, f"{plot}: an empty plot passed as non-empty"


def test_journal_is_what_the_report_read(faulted_report: Path) -> None:
    """The report's data match the journal: both rounds done, one crash, the free-disk series."""
    data = report.gather(faulted_report.parent / "campaign.toml")
    assert [r["round"] for r in data.rounds_done] == [0, 1]
    # One crash; a retry or a ShopSim restart may be marked too when a loaded box slows the resume.
    kinds = [k for _, _, k, _ in data.marks]
    assert kinds.count("crash") == 1 and set(kinds) <= {"crash", "restart"}, data.marks
    assert len(data.disk) > 5 and sorted(data.step_seconds) == [0, 1]
    assert json.dumps(data.environment)  # plain strings only


@pytest.mark.parametrize("view", VIEWPORTS)
def test_no_horizontal_overflow_on_a_phone_and_on_a_desktop(faulted_report: Path, tmp_path: Path, view: str) -> None:
    """At 390x844 and 1280x900 the page is never wider than the screen; the shots are kept."""
    width, height = VIEWPORTS[view]
    probe = _overflow(faulted_report, tmp_path, width, height)
    assert probe["iw"] == width, probe  # the page really was laid out at that width
    assert probe["sw"] <= probe["cw"], f"{view}: the page overflows sideways: {probe}"
    assert probe["out"] == [], probe
    png = tmp_path / f"report-{view}.png"
    _viewport_shot(faulted_report, png, tmp_path, width, height)
    _keep(png)
    assert _coloured(png) >= MIN_COLOURED  # the first screen holds the header's failure and a plot
    tall = tmp_path / f"report-{view}-full.png"
    _viewport_shot(faulted_report, tall, tmp_path, width, 5200)
    _keep(tall)


def test_the_overflow_probe_trips_on_a_page_built_to_overflow(tmp_path: Path) -> None:
    """A 900 px box and a 100-character unbreakable line overflow a phone, not a desktop: the
    probe sees the difference (and names the box)."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    for name, body in (("box", '<div id=wide style="width:900px;height:20px;background:#0072B2"></div>'),
                       ("line", '<p style="white-space:nowrap;font:16px monospace">' + "x" * 100 + "</p>")):
        page = tmp_path / f"{name}.html"
        page.write_text(f"<!DOCTYPE html><html><body>{body}</body></html>")
        phone = _overflow(page, tmp_path, *VIEWPORTS["phone"])
        assert phone["iw"] == 390 and phone["sw"] > phone["cw"], (name, phone)
        desktop = _overflow(page, tmp_path, *VIEWPORTS["desktop"])
        assert desktop["sw"] <= desktop["cw"] and desktop["out"] == [], (name, desktop)
        if name == "box":
            assert any(o.startswith("DIV wide ") for o in phone["out"]), phone


def test_the_page_header_and_dashboard_read_the_nights_records(faulted_report: Path) -> None:
    """The trainer's crash is a failure with its cause and bundle in the header; every round has
    per-step curves from its TRAIN log; every round's val has N and s.e."""
    data = report.gather(faulted_report.parent / "campaign.toml")
    assert [f["state"] for f in data.failures] == ["TRAIN"] and data.failures[0]["round"] == 0
    assert data.failures[0]["cause"] != "" and Path(data.failures[0]["bundle"]).is_dir()
    assert sorted(data.curves) == [0, 1] and all("rollout/reward" in c.rollout for c in data.curves.values())
    assert sorted(data.vals) == [0, 1] and all(v.n and v.reward_sem is not None for v in data.vals.values())
    recorded = [json.loads(ln) for ln in (faulted_report.parent / "state" / "rounds.jsonl").read_text().splitlines()]
    assert [(r["round"], r["val_n"]) for r in recorded] == [(0, 30), (1, 30)]  # from the record, not a fallback
    page = faulted_report.read_text()
    assert data.failures[0]["bundle"] in page and "±1 s.e." in page
