"""STAND-IN for the ShopSimulator service (real: `ShopSimulator/shop_env/start.sh`, which
execs the Flask app `shop_env.pack_api`). It follows the recorded contract
(`../shared/contracts/README.md`, `shopsim-real.jsonl`); the one thing it does not imitate is
the scorer: rewards come from a small deterministic lexical match, with the real keys and types.

Theory of operation:
- A catalog in the real format (one JSON array of products, each with `instructions`; every
  instruction is a task) is loaded and indexed (BM25 over character bigrams), then every slot
  is built, and only THEN is the port bound: there is no "not ready" phase (as the real one).
- `GET /healthz` -> exactly 9 fields. `GET /api/replay/runs` -> `{"runs": [], "runs_root"}`.
  Unrouted paths give Werkzeug's 404 HTML page, a wrong method its 405 page.
- `POST /api/shop_agent {action, ...}`; every JSON answer is `{"result": {...}}`. A body that is
  not JSON, or JSON sent without `Content-Type: application/json`, gives 200 `{"result":
  {"error": "No JSON data provided"}}`; JSON that is not an object gives a 500 HTML page.
- `reset` leases a slot (uuid4 hex `lease_id`; free slots are handed out first-in first-out)
  and BLOCKS while none is free, with no server-side timeout. A client that gives up leaves a
  "ghost waiter" that still takes the next freed slot, even right after `release_all`.
  A failed reset gives its slot back.
- `interact` plays one `search[...]` / `click[...]` action on the slot's page (search home ->
  results -> product page -> options -> `click[buy now]`); invalid actions answer 200 with
  `valid: false`; every action counts towards the limit (single_turn 30, multi_turn 40).
  After `done`, interact and terminate give 500; the lease stays until `release_one`.
- `release_one` on a lease that is not the slot's current one (released already, made up,
  or out of range) gives 409; `release_all` frees every slot and makes every lease stale.

Env: SHOPSIM_ENV_SLOTS (48), SHOPSIM_PORT (5700), SHOPSIM_HOST (127.0.0.1; the real one
hard-codes 0.0.0.0), SHOPSIM_CATALOG or `--catalog PATH` (default: shopsim_catalog.json next to
this file), SHOPSIM_RUNS_ROOT (what /api/replay/runs reports; default ./runs).
Fault knobs (each changes behaviour only when set): DEMO_SHOPSIM_START_DELAY=s (building the
slots takes s seconds: the port is bound s seconds later), DEMO_SHOPSIM_NEVER_READY=1
(/healthz says ready:false and the API answers 503 forever; the real service has no such
state), DEMO_SHOPSIM_HANG_ON_START=1 (never binds the port).
Exit codes: SIGTERM kills at once (status -15, as the real one); SIGINT 130; 1 when the port
cannot be bound; 2 for a bad setting or catalog.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import _common as c

PROG = "shopsim"
ENVIRONMENT_VERSION = "shopsimulator-paper-aligned-v8"
PRIMARY_REWARD = "r_strict"
OBSERVATION_VERSION = "shopping-observation-v7"
REWARD_VERSION = "shopsimulator-paper-reward-v2"
PRICE_VERSION = "variant-price-paper-v2"
DEFAULT_CATALOG = Path(__file__).resolve().parent / "shopsim_catalog.json"
ACTION_LIMITS = {"single_turn": 30, "multi_turn": 40}
TERMINATION_REASONS = ("action_limit", "generation_length")
PAGE_SIZE = 20
BACK, PREV, NEXT, BUY = "back to search", "< prev", "next >", "buy now"

# Werkzeug's error pages, byte for byte: clients that look at the body see HTML, not JSON.
HTML_404 = ("<!doctype html>\n<html lang=en>\n<title>404 Not Found</title>\n<h1>Not Found</h1>\n<p>The requested URL "
            "was not found on the server. If you entered the URL manually please check your spelling and try again.</p>\n")
HTML_405 = ("<!doctype html>\n<html lang=en>\n<title>405 Method Not Allowed</title>\n<h1>Method Not Allowed</h1>\n"
            "<p>The method is not allowed for the requested URL.</p>\n")
HTML_500 = ("<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n<h1>Internal Server Error</h1>\n"
            "<p>The server encountered an internal error and was unable to complete your request. Either the server "
            "is overloaded or there is an error in the application.</p>\n")
ROUTES = {"/healthz": "GET", "/api/replay/runs": "GET", "/api/shop_agent": "POST"}


def log(msg: str) -> None:
    print(f"{PROG}: {msg}", flush=True)


class BadRequest(Exception):
    """A malformed request: HTTP 400."""


class StaleLease(Exception):
    """The slot's current lease differs from the caller's: HTTP 409."""


# ---------------------------------------------------------------- catalog and search

def tokens(text: str) -> list[str]:
    """Lower-case ASCII words, and character bigrams of CJK runs (a lone CJK char as itself)."""
    out: list[str] = []
    for run in re.findall(r"[a-z0-9]+|[\u4e00-\u9fff]+", text.lower()):
        if run.isascii():
            out.append(run)
        elif len(run) == 1:
            out.append(run)
        else:
            out.extend(run[i:i + 2] for i in range(len(run) - 1))
    return out


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise c.DemoError(f"catalog {where}: {what}; fix the catalog (the real format: one JSON array of "
                          "products, see ../shared/contracts/synthetic-catalog.json) or pass another with --catalog", 2)


def price_text(prices: list[float]) -> str:
    lo, hi = min(prices), max(prices)
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


BUDGET = re.compile(r"(\d+(?:\.\d+)?)\s*元")


def price_upper_of(instruction: dict[str, Any]) -> float | None:
    """The task's budget: its `price_upper`, else the first "N元" amount in the instruction."""
    if isinstance(instruction.get("price_upper"), (int, float)) and not isinstance(instruction.get("price_upper"), bool):
        return float(instruction["price_upper"])
    m = BUDGET.search(str(instruction.get("instruction", "")))
    return float(m.group(1)) if m else None


class Catalog:
    """Products and tasks of one catalog file, with a BM25 index over their text."""

    def __init__(self, path: Path):
        self.path = path
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise c.DemoError(f"catalog not found: {path}; pass an existing file with --catalog", 2) from None
        except (OSError, ValueError) as exc:
            raise c.DemoError(f"catalog {path} is not valid JSON: {exc}", 2) from None
        _need(isinstance(raw, list) and bool(raw), str(path), "must be a non-empty JSON array of products")
        self.products: dict[str, dict[str, Any]] = {}
        self.tasks: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        for i, p in enumerate(raw):
            where = f"{path}[{i}]"
            _need(isinstance(p, dict), where, "a product must be an object")
            for key in ("asin", "title", "category"):
                _need(isinstance(p.get(key), str) and bool(p[key]), where, f"'{key}' must be a non-empty string")
            _need(p["asin"] not in self.products, where, f"duplicate asin {p['asin']}")
            opts = p.get("customization_options") or {}
            _need(isinstance(opts, dict), where, "'customization_options' must be an object of axis -> [{value, price}]")
            for axis, values in opts.items():
                _need(isinstance(values, list) and all(isinstance(v, dict) and isinstance(v.get("value"), str)
                                                       and isinstance(v.get("price"), (int, float)) for v in values),
                      f"{where}.customization_options.{axis}", "must be a list of {value: str, price: number}")
            pricing = p.get("pricing")
            _need(isinstance(pricing, list) and bool(pricing) and all(isinstance(x, (int, float)) for x in pricing),
                  f"{where}.pricing", "must be a non-empty list of numbers")
            _need(isinstance(p.get("instructions", []), list), f"{where}.instructions", "must be a list")
            for j, ins in enumerate(p.get("instructions", [])):
                iw = f"{where}.instructions[{j}]"
                _need(isinstance(ins, dict), iw, "must be an object")
                tid = ins.get("task_id")
                _need(isinstance(tid, int) and not isinstance(tid, bool), iw, "'task_id' must be an integer")
                _need(tid not in self.tasks, iw, f"duplicate task_id {tid}")
                _need(isinstance(ins.get("instruction"), str), iw, "'instruction' must be a string")
                self.tasks[tid] = (p, ins)
            self.products[p["asin"]] = p
        _need(bool(self.tasks), str(path), "no product has an instruction (a task)")
        self.order = list(self.products)
        self._docs = [collections.Counter(tokens(" ".join(
            [p["title"], p["category"], str(p.get("product_category", "")), str(p.get("shop_name", "")),
             " ".join(map(str, p.get("attribute") or [])), str(p.get("full_description", ""))])))
            for p in self.products.values()]
        self._avg = sum(sum(d.values()) for d in self._docs) / len(self._docs)
        self._df = collections.Counter(t for d in self._docs for t in d)

    def search(self, query: str) -> list[str]:
        """Asins with a positive BM25 score for `query`, best first (catalog order breaks ties)."""
        n, k1, b = len(self._docs), 1.5, 0.75
        scored = []
        for i, doc in enumerate(self._docs):
            length, score = sum(doc.values()), 0.0
            for t in set(tokens(query)):
                tf = doc.get(t, 0)
                if tf:
                    idf = math.log(1 + (n - self._df[t] + 0.5) / (self._df[t] + 0.5))
                    score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / self._avg))
            if score > 0:
                scored.append((-score, i))
        return [self.order[i] for _, i in sorted(scored)]


def card(p: dict[str, Any]) -> dict[str, Any]:
    return {"asin": p["asin"], "brand": str(p.get("shop_name", "")), "category": p["category"],
            "key_attributes": [str(a) for a in p.get("attribute") or []], "price": price_text(p["pricing"]),
            "title": p["title"]}


def persona_of(p: dict[str, Any]) -> dict[str, Any]:
    persona = p.get("user_persona")
    return {k: v for k, v in persona.items() if k != "__reasoning__"} if isinstance(persona, dict) else {}


# ---------------------------------------------------------------- one episode

def feedback(action: str, valid: bool, reason: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"action": action, "valid": valid, "reason": reason, "message": message, **extra}


def parse_action(text: str) -> tuple[str, str | None, str | None, dict[str, Any] | None]:
    """(shown action, verb, argument, feedback if invalid) of a model response.

    A literal backslash-n counts as a newline. Exactly one `Action:` line (any case) selects
    the action; two such lines, or two actions chained on one line, are refused.
    """
    norm = text.replace("\\n", "\n")
    picked = [m.group(1).strip() for line in norm.splitlines()
              if (m := re.match(r"\s*action\s*:\s*(.*)$", line, re.IGNORECASE))]
    multiple = "一次调用只能执行一个 search[...] 或 click[...] 动作"
    if len(picked) > 1:
        return text, None, None, feedback(text, False, "multiple_actions_not_allowed", multiple)
    action = picked[0] if picked else norm.strip()
    shown = action if picked else text
    if len(re.findall(r"(?:search|click)\[", action)) > 1:
        return shown, None, None, feedback(shown, False, "multiple_actions_not_allowed", multiple)
    if not action:
        return shown, None, None, feedback(shown, False, "invalid_format", "动作不能为空")
    m = re.fullmatch(r"(search|click)\[(.*)\]", action, re.DOTALL)
    if not m:
        return shown, None, None, feedback(shown, False, "invalid_format", "动作必须使用 search[...] 或 click[...] 格式")
    verb, arg = m.group(1), m.group(2).strip()
    if not arg:
        what = "关键词" if verb == "search" else "点击值"
        return shown, None, None, feedback(shown, False, "empty_argument", f"{verb}[...] 的{what}不能为空")
    return shown, verb, arg, None


class Episode:
    """The page state of one slot's episode."""

    def __init__(self, catalog: Catalog, task_id: int, mode: str):
        self.catalog = catalog
        self.task_id = task_id
        self.product, self.instruction = catalog.tasks[task_id]
        self.mode = mode
        self.limit = ACTION_LIMITS[mode]
        self.steps = 0
        self.done = False
        self.page = "search_home"
        self.search_text = ""
        self.results: list[str] = []
        self.page_no = 1
        self.asin: str | None = None
        self.selected: dict[str, str] = {}
        self.last: dict[str, Any] | None = None
        self.purchase: dict[str, Any] = {}
        self.reward_detail: dict[str, Any] = {}
        self.reward: float = 0.0
        self.termination_reason: str | None = None

    # -- goal and scoring

    def goal(self) -> dict[str, Any]:
        ins, p = self.instruction, self.product
        return {"asin": p["asin"], "task_id": self.task_id, "task_uid": str(ins.get("task_uid", f"task-{self.task_id}")),
                "name": p["title"], "category": p["category"], "attributes": list(ins.get("attributes") or []),
                "goal_options": list(ins.get("instruction_options") or []), "instruction_text": ins["instruction"],
                "instruction_simple": str(ins.get("instruction_simple") or ins["instruction"]),
                "price_upper": price_upper_of(ins), "price_constraint": ins.get("price_constraint"),
                "reason_key": ins.get("reason_key"), "source_product_index": ins.get("source_product_index"),
                "user_persona": persona_of(p), "weight": int(ins.get("weight", 1))}

    def no_purchase_detail(self, reason: str) -> dict[str, Any]:
        zero = {k: 0.0 for k in ("r_att", "r_loose", "r_option", "r_price", "r_strict", "r_type")}
        return {"reward_version": REWARD_VERSION, "termination_reason": reason, **zero, "r_success": 0,
                "target_asin_match": False, "price_verifiable": False}

    def price_resolution(self, p: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        varying = [axis for axis, vals in (p.get("customization_options") or {}).items()
                   if len({float(v["price"]) for v in vals}) > 1]
        if varying:
            axis = varying[0]
            price = next(float(v["price"]) for v in p["customization_options"][axis] if v["value"] == self.selected.get(axis))
            return price, {"method": "selected_price_axis", "evidence": {"price_axis": axis}}
        return float(min(p["pricing"])), {"method": "constant_option_price", "evidence": {}}

    def score(self) -> None:
        """A deterministic lexical score with the real keys and types (not the real scorer)."""
        p, goal = self.catalog.products[self.asin or ""], self.goal()
        price, resolution = self.price_resolution(p)
        upper = goal["price_upper"]
        title_a, title_b = set(tokens(p["title"])), set(tokens(goal["name"]))
        title_score = round(len(title_a & title_b) / max(1, len(title_a | title_b)), 6)
        category_match = p["category"] == goal["category"]
        attrs = [a for a in goal["attributes"] if a in (p.get("attribute") or [])]
        opts = [o for o in goal["goal_options"] if o in self.selected.values()]
        r_type = 1.0 if category_match else title_score
        r_att = len(attrs) / len(goal["attributes"]) if goal["attributes"] else 1.0
        r_option = len(opts) / len(goal["goal_options"]) if goal["goal_options"] else 1.0
        r_price = 1.0 if upper is None or price <= upper else 0.0
        r_loose = r_type * (r_att + r_option + r_price) / 3
        r_strict = r_type * r_att * r_option * r_price
        self.reward_detail = {
            "reward_version": REWARD_VERSION, "termination_reason": "purchase", "category_match": category_match,
            "title_score": float(title_score), "num_attr_matches": len(attrs), "num_option_matches": len(opts),
            "r_att": float(r_att), "r_option": float(r_option), "r_price": r_price, "r_loose": float(r_loose),
            "r_strict": float(r_strict), "r_type": float(r_type), "r_success": int(r_strict >= 1.0),
            "target_asin_match": p["asin"] == goal["asin"], "price_verifiable": True, "price_upper": upper,
            "price_resolution": {"status": "pass" if r_price else "fail", **resolution, "version": PRICE_VERSION,
                                 "price": price},
        }
        self.reward = float(r_strict)
        self.purchase = {"asin": p["asin"], "name": p["title"], "category": p["category"],
                         "product_category": str(p.get("product_category", "")),
                         "attributes": [str(a) for a in p.get("attribute") or []],
                         "instruction_text": goal["instruction_text"], "price": price, "options": dict(self.selected)}

    # -- pages

    def _product(self) -> dict[str, Any]:
        return self.catalog.products[self.asin or ""]

    def _page_asins(self) -> list[str]:
        return self.results[(self.page_no - 1) * PAGE_SIZE:self.page_no * PAGE_SIZE]

    def _total_pages(self) -> int:
        return max(1, -(-len(self.results) // PAGE_SIZE))

    def _options(self) -> dict[str, list[str]]:
        return {axis: [v["value"] for v in vals] for axis, vals in (self._product().get("customization_options") or {}).items()}

    def _missing(self) -> list[str]:
        return [axis for axis in self._options() if axis not in self.selected]

    def _selected_price(self) -> float | None:
        p = self._product()
        varying = [axis for axis, vals in (p.get("customization_options") or {}).items()
                   if len({float(v["price"]) for v in vals}) > 1]
        if not varying:
            return float(min(p["pricing"]))
        if varying[0] not in self.selected:
            return None
        return self.price_resolution(p)[0]

    def actions(self) -> list[str]:
        if self.page == "search_results":
            nav = [BACK] + ([PREV] if self.page_no > 1 else []) + ([NEXT] if self.page_no < self._total_pages() else [])
            return nav + self._page_asins()
        if self.page == "product_detail":
            out = [BACK, PREV] + ([BUY] if not self._missing() else [])
            return out + [f"{axis}={v}" for axis, vals in self._options().items() for v in vals
                          if self.selected.get(axis) != v]
        return []

    def state(self) -> tuple[str, dict[str, Any]]:
        """The observation text and `observation_state` of the current page."""
        st: dict[str, Any] = {"page_type": self.page, "observation_version": OBSERVATION_VERSION,
                              "search_available": self.page == "search_home", "actions": self.actions()}
        if self.last is not None:
            st["last_action"] = dict(self.last)
        lines: list[str] = []
        if self.page == "search_home":
            lines = ["页面：搜索首页", ""]
        elif self.page == "search_results":
            asins = self._page_asins()
            start = (self.page_no - 1) * PAGE_SIZE + 1 if asins else 0
            end = start + len(asins) - 1 if asins else 0
            products = [{**card(self.catalog.products[a]), "rank": start + k} for k, a in enumerate(asins)]
            st.update(search_text=self.search_text, normalized_search_text=" ".join(self.search_text.split()),
                      page=self.page_no, total_pages=self._total_pages(), total_results=len(self.results),
                      rank_start=start, rank_end=end, products=products)
            lines = ["页面：搜索结果", f"搜索词：{self.search_text}",
                     f"结果：第 {self.page_no}/{self._total_pages()} 页，共 {len(self.results)} 项，当前显示排名 {start}-{end}",
                     "", "商品列表："]
            for prod in products:
                lines += [f"{prod['rank']}. {prod['title']}", f"   ASIN：{prod['asin']}", f"   价格：{prod['price']}",
                          f"   品牌：{prod['brand']}", f"   类别：{prod['category']}",
                          f"   关键属性：{'；'.join(prod['key_attributes'])}"]
            lines.append("")
        elif self.page == "product_detail":
            prod, price = card(self._product()), self._selected_price()
            st.update(product=prod, available_options=self._options(), selected_options=dict(self.selected),
                      missing_option_axes=self._missing(), options_complete=not self._missing())
            if price is not None:
                st["selected_price"] = price
            lines = ["页面：商品详情", "商品：", f"- 标题：{prod['title']}", f"- ASIN：{prod['asin']}",
                     f"- 价格：{price if price is not None else prod['price']}", f"- 品牌：{prod['brand']}",
                     f"- 类别：{prod['category']}", f"- 关键属性：{'；'.join(prod['key_attributes'])}", "", "规格选择："]
            for axis, vals in self._options().items():
                chosen = self.selected.get(axis)
                lines += [f"- {axis}：{'已选择 ' + chosen if chosen else '尚未选择'}", f"  可选值：{' / '.join(vals)}"]
            lines += [f"仍需选择：{'、'.join(self._missing())}" if self._missing() else "规格状态：已选择全部规格，可以购买", ""]
        else:
            lines = ["页面：任务已终止", "不能再执行操作。", ""]
        if self.last is not None:
            lines += ["上次交互结果：", f"- 结果：{'成功' if self.last['valid'] else '无效'}", f"- 说明：{self.last['message']}"]
            if not self.last["valid"]:
                lines.append(f"- 原因代码：{self.last['reason']}")
            lines.append("")
        if self.page == "search_home":
            lines += ["页面能力：", "- 支持商品搜索"]
        elif self.page == "terminal":
            lines += ["当前页面没有可交互元素。"]
        else:
            lines += ["可点击元素："] + [f"- {a}" for a in st["actions"]]
        return "\n".join(lines) + "\n", st

    # -- one action

    def step(self, text: str) -> dict[str, Any]:
        """Play one model response; returns the action feedback (the caller builds the answer)."""
        shown, verb, arg, fb = parse_action(text)
        if fb is None:
            fb = self._act(shown, verb or "", arg or "")
        self.last = fb
        self.steps += 1
        if not self.done and self.steps >= self.limit:
            self.end("action_limit")
        return fb

    def _act(self, shown: str, verb: str, arg: str) -> dict[str, Any]:
        unavailable = feedback(shown, False, "unavailable_action", f"当前页面不存在可点击项：{arg}")
        if verb == "search":
            if self.page != "search_home":
                return feedback(shown, False, "search_unavailable", "当前页面不提供搜索操作")
            self.search_text, self.results, self.page_no, self.page = arg, self.catalog.search(arg), 1, "search_results"
            return feedback(shown, True, "executed", "搜索已执行")
        ok = feedback(shown, True, "executed", "点击已执行")
        if self.page == "search_results":
            if arg == BACK:
                self.page, self.results, self.search_text = "search_home", [], ""
            elif arg == NEXT and self.page_no < self._total_pages():
                self.page_no += 1
            elif arg == PREV and self.page_no > 1:
                self.page_no -= 1
            elif arg in self._page_asins():
                self.page, self.asin, self.selected = "product_detail", arg, {}
            else:
                return unavailable
            return ok
        if self.page == "product_detail":
            if arg == BACK:
                self.page, self.results, self.search_text, self.asin, self.selected = "search_home", [], "", None, {}
            elif arg == PREV:
                self.page, self.asin, self.selected = "search_results", None, {}
            elif arg == BUY:
                missing = self._missing()
                if missing:
                    return feedback(shown, False, "incomplete_options", f"购买前还需选择规格轴：{'、'.join(missing)}",
                                    missing_option_axes=missing)
                self.score()
                self.page, self.done, self.termination_reason = "terminal", True, "purchase"
                return feedback(shown, True, "executed", "购买已执行")
            else:
                axis, _, value = arg.partition("=")
                if value not in self._options().get(axis, []):
                    return unavailable
                if self.selected.get(axis) == value:
                    return feedback(shown, False, "already_selected", f"该规格已经选中：{arg}")
                self.selected[axis] = value
            return ok
        return unavailable

    def end(self, reason: str) -> None:
        self.done, self.termination_reason = True, reason
        self.reward, self.reward_detail, self.purchase = 0.0, self.no_purchase_detail(reason), {}


# ---------------------------------------------------------------- slots and leases

class SlotPool:
    """Explicit leases, as in the real `slot_lease_pool.SlotLeasePool`: they never expire.

    Free slots are handed out first-in first-out (the real order: a released slot goes to
    the back). A blocked `acquire` holds no slot, so `free_slots` does not count it.
    """

    def __init__(self, size: int):
        self._cond = threading.Condition()
        self.size = size
        self._free: collections.deque[int] = collections.deque(range(size))
        self._leases: dict[int, str] = {}

    def acquire(self) -> tuple[int, str]:
        with self._cond:
            if not self._free:
                log("no free slot; reset is queued (blocks until a release)")
            while not self._free:
                self._cond.wait()
            slot = self._free.popleft()
            lease = uuid.uuid4().hex
            self._leases[slot] = lease
            return slot, lease

    def rollback(self, slot: int) -> None:
        """Give back a slot that a failed reset took, at the front, as if never taken."""
        with self._cond:
            self._leases.pop(slot, None)
            self._free.appendleft(slot)
            self._cond.notify()

    def check(self, slot: int, lease: str) -> None:
        with self._cond:
            if self._leases.get(slot) != lease:
                raise StaleLease(f"stale or invalid lease for environment {slot}")

    def release(self, slot: int, lease: str) -> None:
        with self._cond:
            if self._leases.get(slot) != lease:
                raise StaleLease(f"stale or invalid lease for environment {slot}")
            del self._leases[slot]
            self._free.append(slot)
            self._cond.notify()

    def release_all(self) -> int:
        with self._cond:
            count = len(self._leases)
            self._free = collections.deque(range(self.size))
            self._leases.clear()
            self._cond.notify_all()
            return count

    def free_count(self) -> int:
        with self._cond:
            return len(self._free)


class Shop:
    """Episodes per slot, behind the lease pool: the `/api/shop_agent` actions."""

    def __init__(self, slots: int, catalog: Catalog):
        self.pool = SlotPool(slots)
        self.catalog = catalog
        self.episodes: dict[int, Episode] = {}
        self.lock = threading.Lock()

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        action = req.get("action")
        if action == "release_all":
            count = self.pool.release_all()
            log(f"release_all freed {count} leased slot(s)")
            return {"message": "All environments have been initialized"}
        if action == "reset":
            return self._reset(req)
        if action not in ("interact", "terminate", "release_one"):
            raise BadRequest(f"unsupported action: {action!r}")
        slot, lease = req.get("env_idx"), req.get("lease_id")
        if isinstance(slot, bool) or not isinstance(slot, int) or not isinstance(lease, str) or not lease:
            raise BadRequest(f"{action} requires a valid env_idx and lease_id")
        if action == "release_one":
            self.pool.release(slot, lease)
            return {"message": f"Environment {slot} has been released"}
        self.pool.check(slot, lease)
        with self.lock:
            episode = self.episodes[slot]
            if action == "interact":
                return self._interact(slot, lease, episode, req)
            return self._terminate(slot, lease, episode, req)

    def _reset(self, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("env_idx") is not None:
            raise BadRequest("reset must not include env_idx; the server assigns a slot")
        slot, lease = self.pool.acquire()
        try:
            idx = req.get("idx")
            if idx is None:
                raise ValueError("reset action requires idx parameter")
            if isinstance(idx, bool) or not isinstance(idx, int):
                raise ValueError("task idx must be an integer")
            if idx not in self.catalog.tasks:
                raise KeyError(f"unknown or inactive task_id {idx}")  # str(KeyError) quotes it, as the real one
            mode = req.get("interaction_mode", "single_turn")
            if mode not in ACTION_LIMITS:
                raise ValueError(f"unsupported interaction_mode {mode!r}; choose one of {sorted(ACTION_LIMITS)}")
            episode = Episode(self.catalog, idx, mode)
        except Exception:
            self.pool.rollback(slot)
            raise
        with self.lock:
            self.episodes[slot] = episode
        observation, state = episode.state()
        ins = episode.instruction
        out: dict[str, Any] = {
            "env_idx": slot, "lease_id": lease, "idx": idx, "message": f"Task {idx} started",
            "task_instruction": ins["instruction"], "task_mode": "persona" if req.get("if_persona") else "standard",
            "interaction_mode": mode, "environment_version": ENVIRONMENT_VERSION, "observation": observation,
            "observation_state": state, "user_persona": persona_of(episode.product),
        }
        if req.get("include_private_goal"):
            out.update(private_task_instruction=ins["instruction"], goal_options=list(ins.get("instruction_options") or []),
                       reason_key=ins.get("reason_key"))
        return out

    def _answer(self, slot: int, lease: str, episode: Episode, message: str, reward: float) -> dict[str, Any]:
        observation, state = episode.state()
        out = {"done": episode.done, "over": episode.done, "reward": reward, "observation": observation,
               "observation_state": state, "message": message, "env_idx": slot,
               "idx": f"slot-{slot}-{episode.task_id}", "lease_id": lease,
               "reward_detail": dict(episode.reward_detail) if episode.done else {},
               "purchase": dict(episode.purchase) if episode.done else {},
               "goal": episode.goal() if episode.done else {}}
        if episode.done:
            out["termination_reason"] = episode.termination_reason
        return out

    def _interact(self, slot: int, lease: str, episode: Episode, req: dict[str, Any]) -> dict[str, Any]:
        if episode.done:
            raise RuntimeError("episode is already terminated; reset before stepping")
        if "response" not in req or req["response"] is None:
            raise ValueError("interact action requires response parameter")
        text = req["response"]
        text.replace("\\n", "\n")  # a non-string fails here with the real message ("'int' object has no attribute ...")
        fb = episode.step(text)
        # The real reward is the int 0 after an invalid action that leaves the episode running.
        reward: float = episode.reward if episode.done else (0.0 if fb["valid"] else 0)
        out = self._answer(slot, lease, episode, "Continue interaction" if fb["valid"] else "Invalid action", reward)
        out["action_feedback"] = dict(fb)
        return out

    def _terminate(self, slot: int, lease: str, episode: Episode, req: dict[str, Any]) -> dict[str, Any]:
        if episode.done:
            raise RuntimeError("episode is already terminated")
        reason = req.get("termination_reason") or "action_limit"
        if reason not in TERMINATION_REASONS:
            raise ValueError(f"unsupported termination reason: {reason}")
        episode.end(reason)
        return self._answer(slot, lease, episode, f"Episode terminated: {reason}", 0.0)


# ---------------------------------------------------------------- HTTP

class Handler(BaseHTTPRequestHandler):
    server: "ShopServer"
    protocol_version = "HTTP/1.1"  # keep-alive, as Werkzeug's threaded server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # request lines are noise; lease events are logged by the Shop

    def _html(self, status: int, page: str, allow: str | None = None) -> None:
        data = page.encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            if allow:
                self.send_header("Allow", allow)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass

    def _route(self, method: str) -> bool:
        """True when the path and method are served; else the 404/405 page has been sent."""
        path = self.path.split("?", 1)[0]
        want = ROUTES.get(path)
        if want is None:
            self._html(404, HTML_404)
            return False
        if method != want and not (method == "HEAD" and want == "GET"):
            self._html(405, HTML_405, allow=", ".join(["HEAD", "GET", "OPTIONS"] if want == "GET" else ["POST", "OPTIONS"]))
            return False
        return True

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def do_GET(self) -> None:
        if not self._route("GET"):
            return
        srv = self.server
        if self.path.split("?", 1)[0] == "/api/replay/runs":
            c.send_reply(self, 200, {"runs": [], "runs_root": srv.runs_root})
            return
        c.send_reply(self, 200, {
            "ready": srv.is_ready(), "environment_slots": srv.shop.pool.size, "free_slots": srv.shop.pool.free_count(),
            "tasks": len(srv.shop.catalog.tasks), "environment_version": ENVIRONMENT_VERSION,
            "primary_reward": PRIMARY_REWARD, "observation_version": OBSERVATION_VERSION,
            "debug_ui": "/debug-ui", "replay_ui": "/replay-ui",
        })

    def do_POST(self) -> None:
        raw = self._body()  # read the whole request first: a later SIGKILL then closes the socket cleanly
        if not self._route("POST"):
            return
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        req: Any = None
        if ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json")):
            try:
                req = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                req = None
        if req is None:  # Flask's get_json(silent=True) gives None: the app answers 200 with an error
            c.send_reply(self, 200, {"result": {"error": "No JSON data provided"}})
            return
        if not isinstance(req, dict):  # the app calls req.get(...) on it: an unhandled error, Flask's 500 page
            self._html(500, HTML_500)
            return
        if not self.server.is_ready():
            c.send_reply(self, 503, {"result": {"error": "environments are not ready (DEMO_SHOPSIM_NEVER_READY)"}})
            return
        agent_log(f"[Request] action={req.get('action')!r} env_idx={req.get('env_idx')!r}")
        try:
            result = self.server.shop.handle(req)
        except BadRequest as exc:
            c.send_reply(self, 400, {"result": {"error": str(exc)}})
        except StaleLease as exc:
            c.send_reply(self, 409, {"result": {"error": str(exc)}})
        except Exception as exc:  # the real app maps any other exception to 500 with str(exc)
            c.send_reply(self, 500, {"result": {"error": str(exc)}})
        else:
            c.send_reply(self, 200, {"result": result})

    def do_PUT(self) -> None:
        self._body()
        if self._route("PUT"):
            self._html(405, HTML_405)

    do_DELETE = do_PATCH = do_PUT


class ShopServer(ThreadingHTTPServer):
    daemon_threads = True  # blocked resets must not hold up an exit
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], shop: Shop, never_ready: bool, runs_root: str):
        super().__init__(addr, Handler)
        self.shop = shop
        self.never_ready = never_ready
        self.runs_root = runs_root

    def is_ready(self) -> bool:
        return not self.never_ready


# --agent-log PATH: append every request to PATH (relative: to the cwd), as the real pack_api's
# logging.FileHandler("shop_agent.log") does in the dir its start.sh cds into. Off by default, so
# the demo campaign writes nothing in its cwd; the start.sh stand-in in tests turns it on.
_AGENT_LOG: Any = None
_AGENT_LOG_LOCK = threading.Lock()


def agent_log(message: str) -> None:
    if _AGENT_LOG is not None:
        with _AGENT_LOG_LOCK:
            _AGENT_LOG.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [INFO] {message}\n")
            _AGENT_LOG.flush()


def parse_argv(argv: list[str]) -> str | None:
    global _AGENT_LOG
    catalog = os.environ.get("SHOPSIM_CATALOG") or None
    it = iter(argv)
    for arg in it:
        if arg == "--agent-log":
            where = next(it, None)
            if not where:
                raise c.DemoError("--agent-log needs a path: --agent-log PATH", 2)
            _AGENT_LOG = open(where, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life)
        elif arg == "--catalog":
            catalog = next(it, None)
            if not catalog:
                raise c.DemoError("--catalog needs a path: --catalog PATH", 2)
        elif arg.startswith("--catalog="):
            catalog = arg.split("=", 1)[1]
        elif arg in ("-h", "--help"):
            print("usage: shopsim.py [--catalog PATH] [--agent-log PATH]   (env: SHOPSIM_ENV_SLOTS, SHOPSIM_PORT, SHOPSIM_HOST)")
            raise SystemExit(0)
        else:
            raise c.DemoError(f"unknown argument {arg!r}; usage: shopsim.py [--catalog PATH] [--agent-log PATH]", 2)
    return catalog


def main() -> int:
    catalog_path = Path(parse_argv(sys.argv[1:]) or DEFAULT_CATALOG)
    slots = c.env_int("SHOPSIM_ENV_SLOTS", 48) or 0
    port = c.env_int("SHOPSIM_PORT", 5700)
    host = os.environ.get("SHOPSIM_HOST", "127.0.0.1")
    if slots < 1:
        raise c.DemoError("SHOPSIM_ENV_SLOTS must be >= 1", 2)
    # As the real service: SIGTERM kills at once (status -15), with no drain.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if c.env_flag("DEMO_SHOPSIM_HANG_ON_START"):
        log("hanging on start (DEMO_SHOPSIM_HANG_ON_START=1); the port is never bound")
        while True:
            time.sleep(3600)
    catalog = Catalog(catalog_path)
    shop = Shop(slots, catalog)
    delay = c.env_float("DEMO_SHOPSIM_START_DELAY", 0.0)
    if delay > 0:
        log(f"building {slots} slots for {delay}s (DEMO_SHOPSIM_START_DELAY); the port is bound after")
        time.sleep(delay)
    runs_root = str(Path(os.environ.get("SHOPSIM_RUNS_ROOT") or "runs").resolve())
    try:
        srv = ShopServer((host, port or 0), shop, c.env_flag("DEMO_SHOPSIM_NEVER_READY"), runs_root)
    except OSError as exc:
        raise c.DemoError(f"cannot bind {host}:{port}: {exc.strerror or exc}", 1) from None
    agent_log(f"serving {slots} slots on port {srv.server_address[1]}")
    log(f"serving on http://{host}:{srv.server_address[1]} slots={slots} tasks={len(catalog.tasks)} "
        f"catalog={catalog_path} pid={os.getpid()}")
    try:
        srv.serve_forever(poll_interval=0.5)
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    c.run_main(PROG, main)
