"""Procedural task generator: site specs, their real implementations, and workflows.

A spec (plain JSON) fixes a category, palette, texts, items and per-viewport layout rules
(columns: desktop ``cols`` -> tablet 2 -> mobile 1; header stacked on mobile). ``render_site`` turns a
spec into a real site folder (the oracle), optionally with injected bugs:

* L1 static page (header, hero, card grid, footer);
* L2 single-page app (hash routes home / about / cart; add-to-cart, cart rows, removal; JS state);
* L3 full stack: a notes frontend plus ``server.py`` (stdlib HTTP + SQLite on 127.0.0.1: register,
  login, notes CRUD, logout; started through start.json).

``workflows(spec)`` returns the workflow.json list (one workflow per viewport, in the order
desktop, tablet, mobile, all in one un-reset session).

Bug catalogue (the ground truth of the verifier's recall and of the judge's detection), built for
**equal exposure**: every functional bug of a level breaks the same case indices in every viewport's
workflow; every visual bug applies at every level and every viewport where its target exists
(``layout_<viewport>`` breaks exactly one viewport's layout, one such bug per viewport).
``BUG_AFFECTS[level][bug]`` lists the case indices (within each workflow) the bug can turn non-Pass
("all" = the site never starts).
"""
from __future__ import annotations

import colorsys
import json
import random
from pathlib import Path
from typing import Any

VIEWPORTS = {"desktop": (1280, 800), "tablet": (768, 1024), "mobile": (390, 844)}
CATEGORIES = {
    "shop": ["Lamp", "Chair", "Mug", "Vase", "Clock", "Shelf", "Rug", "Kettle"],
    "bakery": ["Croissant", "Baguette", "Scone", "Muffin", "Brioche", "Tart", "Eclair", "Bagel"],
    "books": ["Atlas", "Novel", "Poems", "Memoir", "Guide", "Essays", "Comics", "Diary"],
    "garden": ["Fern", "Cactus", "Tulip", "Orchid", "Basil", "Ivy", "Rose", "Sage"],
    "music": ["Vinyl", "Guitar", "Drum", "Flute", "Banjo", "Cello", "Harp", "Piano"],
    "sport": ["Ball", "Racket", "Helmet", "Glove", "Skates", "Bike", "Kayak", "Rope"],
    "travel": ["Map", "Tent", "Compass", "Lantern", "Pack", "Boots", "Canteen", "Hammock"],
    "tech": ["Router", "Mouse", "Keyboard", "Cable", "Speaker", "Webcam", "Dock", "Tablet"],
}
ADJ = ["Bright", "Quiet", "Lucky", "Swift", "Golden", "Urban", "Cosy", "Bold", "North", "Blue"]
NOUN = ["Harbor", "Studio", "Corner", "Market", "Garden", "Works", "House", "Lane", "Yard", "Loft"]
CENTS = (0.15, 0.25, 0.45, 0.5, 0.75, 0.99)   # never whole dollars: a truncated total is visible
# functional bugs -> case indices (0-based, within every workflow) they can break
BUG_AFFECTS: dict[str, dict[str, list[int] | str]] = {
    "L2": {"nav_about_broken": [0], "add_broken": [1, 2, 3, 4, 5], "cart_page_missing": [4, 5],
           "remove_broken": [5], "remove_wrong_item": [5], "remove_first_row": [5], "total_truncates_cents": [4, 5]},
    "L3": {"register_broken": [0, 1, 2, 3, 4, 5, 6, 7], "login_broken": [6, 7], "create_broken": [1, 2, 3, 4, 5, 6],
           "reload_broken": [4, 5, 6, 7], "delete_broken": [5, 6], "delete_wrong_item": [5], "delete_oldest": [5],
           "start_broken": "all"},
}
# visual bugs: every one applies at every level; layout_<vp> breaks only that viewport's layout
VISUAL_BUGS = ("color_shift", "missing_footer", "spacing", "font_swap",
               "layout_desktop", "layout_tablet", "layout_mobile")


def bug_viewports(bug: str) -> tuple[str, ...]:
    """Viewports whose prototypes a visual bug changes (equal exposure: all, or exactly one)."""
    if bug.startswith("layout_"):
        return (bug.split("_", 1)[1],)
    return tuple(VIEWPORTS)


def _hex(h: float, s: float, v: float) -> str:
    r, g, b = colorsys.hsv_to_rgb(h % 1.0, s, v)
    return "#%02x%02x%02x" % (round(r * 255), round(g * 255), round(b * 255))


def make_spec(level: str, seed: int, index: int) -> dict[str, Any]:
    rng = random.Random(f"v2w-{level}-{seed}-{index}")
    cat = rng.choice(sorted(CATEGORIES))
    hue = rng.random()
    words = rng.sample(CATEGORIES[cat], k=rng.randint(3, 6))
    items = [{"id": i, "name": f"{rng.choice(ADJ)} {w}", "price": round(rng.randint(3, 99) + rng.choice(CENTS), 2),
              "color": _hex(hue + rng.uniform(-0.25, 0.25), rng.uniform(0.3, 0.8), rng.uniform(0.6, 0.95))}
             for i, w in enumerate(words)]
    # the tested totals (a + b + c in the cart, a + c after removing b) keep their cents
    while round(100 * (items[0]["price"] + items[2]["price"])) % 100 == 0:
        items[2]["price"] = round(items[2]["price"] + 0.25, 2)
    while round(100 * (items[0]["price"] + items[1]["price"] + items[2]["price"])) % 100 == 0:
        items[1]["price"] = round(items[1]["price"] + 0.25, 2)
    spec = {
        "level": level, "seed": seed, "index": index, "category": cat,
        "name": f"{rng.choice(ADJ)} {rng.choice(NOUN)}",
        "primary": _hex(hue, rng.uniform(0.5, 0.9), rng.uniform(0.35, 0.7)),
        "accent": _hex(hue + 0.5, rng.uniform(0.08, 0.25), 0.97),
        "background": _hex(hue, 0.03, 0.99),
        "radius": rng.choice([0, 4, 8, 14]),
        "cols": rng.choice([3, 4]),
        "pad": rng.choice([24, 32, 40]),
        "hero_title": f"{rng.choice(ADJ)} {cat} for every day",
        "hero_text": f"Hand-picked {cat} items, delivered by the {rng.choice(NOUN).lower()} team.",
        "about_title": f"About {rng.choice(ADJ)} {rng.choice(NOUN)}",
        "about_text": f"We started in {rng.randint(1950, 2020)} with {rng.randint(2, 9)} friends and one idea.",
        "items": items,
        "notes": [f"{rng.choice(ADJ)} {w} note" for w in rng.sample(CATEGORIES[cat], k=2)],
        "footer": f"(c) {rng.randint(2001, 2025)} {cat} collective",
    }
    used = {n.split()[1] for n in spec["notes"]}
    spec["notes"].append(f"{rng.choice(ADJ)} {rng.choice([w for w in CATEGORIES[cat] if w not in used])} note")
    return spec


# ---------------------------------------------------------------- rendering
def _css(spec: dict[str, Any], bugs: set[str]) -> str:
    primary, accent, bg = spec["primary"], spec["accent"], spec["background"]
    radius, cols, pad = spec["radius"], spec["cols"], spec["pad"]
    mpad = 16                                  # the mobile padding
    if "color_shift" in bugs:
        primary = "#" + "".join("%02x" % ((int(primary[i:i + 2], 16) + 60) % 256) for i in (1, 3, 5))
    if "spacing" in bugs:                      # equal exposure: every breakpoint's padding grows
        pad, mpad = pad + 14, mpad + 14
    head_font = "'DejaVu Serif',serif" if "font_swap" in bugs else "'DejaVu Sans',sans-serif"
    css = f"""
body{{margin:0;font-family:'DejaVu Sans',sans-serif;background:{bg};color:#222}}
h1,h2,h3,.brand{{font-family:{head_font}}}
.hdr{{display:flex;justify-content:space-between;align-items:center;padding:16px {pad}px;background:{primary};color:#fff}}
.brand{{font-size:22px;font-weight:bold}}
.nav a{{color:#fff;margin-left:18px;text-decoration:none;font-size:16px}}
.hero{{padding:44px {pad}px;background:{accent}}}
.hero h1{{font-size:38px;margin:0 0 10px;color:{primary}}}
.hero p{{margin:0;font-size:17px}}
.grid{{display:grid;grid-template-columns:repeat({cols},1fr);gap:20px;padding:{pad}px}}
.card{{background:#fff;border-radius:{radius}px;padding:14px;border:1px solid #ddd}}
.swatch{{height:84px;border-radius:{radius}px;margin-bottom:10px}}
.card h3{{margin:0 0 6px;font-size:18px}} .price{{color:{primary};font-weight:bold}}
button{{background:{primary};color:#fff;border:0;border-radius:{radius}px;padding:8px 14px;font-size:15px;margin-top:8px}}
.panel{{padding:{pad}px}} .row{{display:flex;justify-content:space-between;padding:10px 0;border-bottom:1px solid #ddd}}
input{{font-size:15px;padding:6px;margin:4px 0;display:block;width:220px}}
form{{margin-bottom:18px}}
footer{{padding:22px {pad}px;background:#222;color:#eee;font-size:14px}}
@media (max-width:1023px){{.grid{{grid-template-columns:repeat(2,1fr)}} .hero h1{{font-size:30px}}}}
@media (max-width:600px){{.grid{{grid-template-columns:1fr;padding:{mpad}px}} .hdr{{flex-direction:column;align-items:flex-start;padding:12px {mpad}px}}
.nav a{{margin:6px 14px 0 0}} .hero{{padding:26px {mpad}px}} .hero h1{{font-size:24px}} footer{{padding:18px {mpad}px}} .panel{{padding:{mpad}px}}}}
"""
    # ALGO (equal exposure): layout_<vp> breaks the main layout at that viewport only (wrong grid column
    # count on pages with a grid, full-width inputs on form pages)
    broken = {"layout_desktop": ("(min-width:1024px)", cols - 1), "layout_tablet": ("(min-width:601px) and (max-width:1023px)", 3),
              "layout_mobile": ("(max-width:600px)", 2)}
    for bug, (query, n) in broken.items():
        if bug in bugs:
            css += f"@media {query}{{.grid{{grid-template-columns:repeat({n},1fr)}} input{{width:calc(100% - 14px)}}}}\n"
    return css


def _page(spec: dict[str, Any], css: str, nav: str, main: str, footer: bool, script: str = "") -> str:
    foot = f'<footer data-v2w="footer">{spec["footer"]}</footer>' if footer else ""
    return (f'<!doctype html><html><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>{spec["name"]}</title><style>{css}</style></head>'
            f'<body><header class="hdr" data-v2w="header"><div class="brand">{spec["name"]}</div>'
            f'<nav class="nav">{nav}</nav></header><main id="app">{main}</main>{foot}'
            f'<script>{script}</script></body></html>\n')


def _cards(spec: dict[str, Any], buttons: bool) -> str:
    out = []
    for it in spec["items"]:
        btn = f'<button data-testid="add-{it["id"]}" onclick="add({it["id"]})">Add to cart</button>' if buttons else ""
        out.append(f'<div class="card" data-v2w="card-{it["id"]}"><div class="swatch" style="background:{it["color"]}">'
                   f'</div><h3>{it["name"]}</h3><div class="price">${it["price"]:.2f}</div>{btn}</div>')
    return '<div class="grid">' + "".join(out) + "</div>"


def _hero(spec: dict[str, Any]) -> str:
    return f'<section class="hero" data-v2w="hero"><h1>{spec["hero_title"]}</h1><p>{spec["hero_text"]}</p></section>'


def _l2_script(spec: dict[str, Any], bugs: set[str]) -> str:
    items = json.dumps([{k: it[k] for k in ("id", "name", "price")} for it in spec["items"]])
    home = json.dumps(_hero(spec) + _cards(spec, True))
    about = json.dumps(f'<section class="panel" data-v2w="about"><h2 data-testid="about-title">{spec["about_title"]}'
                       f'</h2><p>{spec["about_text"]}</p></section>')
    add = "" if "add_broken" in bugs else "cart.push(id);"
    remove = ("" if "remove_broken" in bugs else "cart.pop();" if "remove_wrong_item" in bugs
              else "cart.shift();" if "remove_first_row" in bugs
              else "const k=cart.indexOf(id); if(k>=0) cart.splice(k,1);")
    total = "Math.floor(total)" if "total_truncates_cents" in bugs else "total"
    cart_page = "'<p>Not found</p>'" if "cart_page_missing" in bugs else (
        "'<section class=\"panel\" data-v2w=\"cart\"><h2>Your cart</h2>' + cart.map(id => {const it=ITEMS[id];"
        " return '<div class=\"row\" data-testid=\"cart-row\"><span>'+it.name+'</span><span>$'+it.price.toFixed(2)+"
        "'</span><button data-testid=\"remove-'+id+'\" onclick=\"removeItem('+id+')\">Remove</button></div>';}).join('')"
        " + '<p data-testid=\"cart-total\">Total: $'+(" + total + ").toFixed(2)+'</p></section>'")
    return f"""
const ITEMS={items}; let cart=[];
function add(id){{ {add} render(); }}
function removeItem(id){{ {remove} render(); }}
function render(){{
  const total=cart.reduce((s,id)=>s+ITEMS[id].price,0);
  const r=(location.hash||'#/').slice(1);
  document.querySelector('[data-testid=cart-count]').textContent=String(cart.length);
  const app=document.getElementById('app');
  if(r==='/about') app.innerHTML={about};
  else if(r==='/cart') app.innerHTML={cart_page};
  else app.innerHTML={home};
}}
window.addEventListener('hashchange',render); render();
"""


def _l3_script(spec: dict[str, Any], bugs: set[str]) -> str:
    restore = "" if "reload_broken" in bugs else "if(localStorage.getItem('tok')) showBoard();"
    return """
const $=s=>document.querySelector(s);
async function api(method,path,body){const r=await fetch(path,{method,headers:{'Content-Type':'application/json',
 'X-Token':localStorage.getItem('tok')||''},body:body?JSON.stringify(body):undefined});
 if(!r.ok) throw new Error(r.status); return r.json();}
function esc(s){return s.replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));}
async function auth(kind){const u=$('[data-testid='+kind+'-user]').value,p=$('[data-testid='+kind+'-pass]').value;
 try{const d=await api('POST','/api/'+kind,{user:u,password:p}); localStorage.setItem('tok',d.token);
 localStorage.setItem('user',u); showBoard();}catch(e){$('[data-testid=auth-error]').textContent='Error '+e.message;}}
async function showBoard(){$('#login').style.display='none'; $('#board').style.display='block';
 $('[data-testid=welcome]').textContent='Welcome, '+localStorage.getItem('user'); await refresh();}
async function refresh(){let items=[]; try{items=await api('GET','/api/items');}catch(e){}
 $('[data-testid=items]').innerHTML=items.map(it=>'<div class="row" data-testid="item-row"><span>'+esc(it.title)+
 '</span><button data-testid="delete" onclick="del('+it.id+')">Delete</button></div>').join('');}
async function create(){const t=$('[data-testid=new-title]').value; try{await api('POST','/api/items',{title:t});}catch(e){}
 $('[data-testid=new-title]').value=''; await refresh();}
async function del(id){try{await api('DELETE','/api/items/'+id);}catch(e){} await refresh();}
async function logout(){try{await api('POST','/api/logout');}catch(e){} localStorage.removeItem('tok');
 $('#board').style.display='none'; $('#login').style.display='block';}
""" + restore


def _l3_main(spec: dict[str, Any]) -> str:
    return ('<section class="panel" id="login" data-v2w="login"><div data-testid="login-form">'
            '<h2>Create an account</h2><form onsubmit="auth(\'register\');return false">'
            '<input data-testid="register-user" placeholder="user"><input data-testid="register-pass" '
            'type="password" placeholder="password"><button data-testid="register-submit">Register</button></form>'
            '<h2>Log in</h2><form onsubmit="auth(\'login\');return false"><input data-testid="login-user" '
            'placeholder="user"><input data-testid="login-pass" type="password" placeholder="password">'
            '<button data-testid="login-submit">Log in</button></form><p data-testid="auth-error"></p></div></section>'
            '<section class="panel" id="board" data-v2w="board" style="display:none"><h2 data-testid="welcome"></h2>'
            f'<p>{spec["hero_text"]}</p><form onsubmit="create();return false"><input data-testid="new-title" '
            'placeholder="new note"><button data-testid="new-submit">Add note</button></form>'
            '<div data-testid="items"></div><button data-testid="logout" onclick="logout()">Log out</button></section>')


SERVER_PY = r'''"""Generated L3 backend: stdlib HTTP + SQLite on 127.0.0.1 (register/login/notes/logout)."""
import argparse, hashlib, json, secrets, sqlite3, threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BUGS = set(%(bugs)r)
ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--db", required=True)
args = ap.parse_args()
db = sqlite3.connect(args.db, check_same_thread=False)
lock = threading.Lock()
db.executescript("CREATE TABLE IF NOT EXISTS users(name TEXT PRIMARY KEY, pw TEXT);"
                 "CREATE TABLE IF NOT EXISTS tokens(tok TEXT PRIMARY KEY, name TEXT);"
                 "CREATE TABLE IF NOT EXISTS items(id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT, title TEXT);")
ROOT = str(Path(__file__).resolve().parent)


class H(SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory=ROOT, **k)

    def log_message(self, *a):
        pass

    def send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def user(self):
        row = db.execute("SELECT name FROM tokens WHERE tok=?", (self.headers.get("X-Token", ""),)).fetchone()
        return row[0] if row else None

    def do_GET(self):
        if self.path == "/api/items":
            with lock:
                u = self.user()
                if u is None:
                    return self.send(401, {"error": "login"})
                rows = db.execute("SELECT id, title FROM items WHERE owner=? ORDER BY id", (u,)).fetchall()
            return self.send(200, [{"id": i, "title": t} for i, t in rows])
        if self.path.startswith("/api/") or self.path.endswith(".py") or ".db" in self.path:
            return self.send(404, {"error": "not found"})
        return super().do_GET()

    def do_POST(self):
        b = self.body()
        with lock:
            if self.path in ("/api/register", "/api/login"):
                name, pw = str(b.get("user", "")), hashlib.sha256(str(b.get("password", "")).encode()).hexdigest()
                if not name:
                    return self.send(400, {"error": "user"})
                if self.path == "/api/register":
                    if "register_broken" in BUGS:
                        return self.send(500, {"error": "internal"})
                    try:
                        db.execute("INSERT INTO users VALUES(?, ?)", (name, pw))
                    except sqlite3.IntegrityError:
                        return self.send(409, {"error": "exists"})
                elif ("login_broken" in BUGS
                      or db.execute("SELECT 1 FROM users WHERE name=? AND pw=?", (name, pw)).fetchone() is None):
                    return self.send(401, {"error": "credentials"})
                tok = secrets.token_hex(16)
                db.execute("INSERT INTO tokens VALUES(?, ?)", (tok, name))
                db.commit()
                return self.send(200, {"token": tok})
            u = self.user()
            if u is None:
                return self.send(401, {"error": "login"})
            if self.path == "/api/items":
                if "create_broken" not in BUGS:
                    db.execute("INSERT INTO items(owner, title) VALUES(?, ?)", (u, str(b.get("title", ""))[:200]))
                    db.commit()
                return self.send(200, {"ok": True})
            if self.path == "/api/logout":
                db.execute("DELETE FROM tokens WHERE tok=?", (self.headers.get("X-Token", ""),))
                db.commit()
                return self.send(200, {"ok": True})
        return self.send(404, {"error": "not found"})

    def do_DELETE(self):
        with lock:
            u = self.user()
            if u is None or not self.path.startswith("/api/items/"):
                return self.send(404, {"error": "not found"})
            try:
                item = int(self.path.rsplit("/", 1)[1])
            except ValueError:
                return self.send(404, {"error": "not found"})
            if "delete_wrong_item" in BUGS:   # deletes the newest OTHER note of the user
                db.execute("DELETE FROM items WHERE id=(SELECT id FROM items WHERE owner=? AND id<>? "
                           "ORDER BY id DESC LIMIT 1)", (u, item))
                db.commit()
            elif "delete_oldest" in BUGS:     # deletes the user's oldest note, whichever was clicked
                db.execute("DELETE FROM items WHERE id=(SELECT id FROM items WHERE owner=? "
                           "ORDER BY id ASC LIMIT 1)", (u,))
                db.commit()
            elif "delete_broken" not in BUGS:
                db.execute("DELETE FROM items WHERE id=? AND owner=?", (item, u))
                db.commit()
            return self.send(200, {"ok": True})


ThreadingHTTPServer(("127.0.0.1", args.port), H).serve_forever()
'''


def render_site(spec: dict[str, Any], out: Path, bugs: set[str] | frozenset[str] = frozenset()) -> None:
    """Write the reference site for ``spec`` (index.html; L3 also server.py + start.json) into ``out``,
    with the named bugs of the catalogue injected (unknown names are an error)."""
    unknown = set(bugs) - set(VISUAL_BUGS) - set(BUG_AFFECTS.get(spec["level"], {}))
    if unknown:
        raise ValueError(f"bugs {sorted(unknown)} do not apply to level {spec['level']}")
    out.mkdir(parents=True, exist_ok=True)
    css = _css(spec, set(bugs))
    footer = "missing_footer" not in bugs
    level = spec["level"]
    if level == "L1":
        nav = "".join(f'<a href="#">{t}</a>' for t in ("Home", "Shop", "Contact"))
        html = _page(spec, css, nav, _hero(spec) + _cards(spec, False), footer)
    elif level == "L2":
        about_href = "#/" if "nav_about_broken" in bugs else "#/about"
        nav = (f'<a data-testid="nav-home" href="#/">Home</a><a data-testid="nav-about" href="{about_href}">About</a>'
               f'<a data-testid="nav-cart" href="#/cart">Cart (<span data-testid="cart-count">0</span>)</a>')
        html = _page(spec, css, nav, "", footer, _l2_script(spec, set(bugs)))
    else:
        html = _page(spec, css, '<a href="#">Notes</a>', _l3_main(spec), footer, _l3_script(spec, set(bugs)))
        (out / "server.py").write_text(SERVER_PY % {"bugs": sorted(bugs)})
        script = "srv.py" if "start_broken" in bugs else "server.py"
        (out / "start.json").write_text(json.dumps(
            {"command": ["{python}", script, "--port", "{port}", "--db", "{tmp}/app.db"],
             "ready_timeout_s": 10, "ready_path": "/"}, indent=1))
    (out / "index.html").write_text(html)


# ---------------------------------------------------------------- workflows
def _sel(testid: str) -> str:
    return f"[data-testid={testid}]"


def _l2_cases(spec: dict[str, Any]) -> list[dict[str, Any]]:
    a, b, c = spec["items"][0], spec["items"][1], spec["items"][2]
    row = _sel("cart-row")
    total = a["price"] + b["price"] + c["price"]
    return [
        {"objective": "Open the About page from the navigation bar",
         "actions": [{"op": "click", "selector": _sel("nav-about")}],
         "validations": [{"op": "url_contains", "value": "#/about"},
                         {"op": "text_equals", "selector": _sel("about-title"), "value": spec["about_title"]}]},
        {"objective": f"Go back home and add '{a['name']}' to the cart",
         "actions": [{"op": "click", "selector": _sel("nav-home")}, {"op": "click", "selector": _sel(f"add-{a['id']}")}],
         "validations": [{"op": "text_equals", "selector": _sel("cart-count"), "value": "1"}]},
        {"objective": f"Add '{b['name']}' to the cart",
         "actions": [{"op": "click", "selector": _sel(f"add-{b['id']}")}],
         "validations": [{"op": "text_equals", "selector": _sel("cart-count"), "value": "2"}]},
        {"objective": f"Add '{c['name']}' to the cart",
         "actions": [{"op": "click", "selector": _sel(f"add-{c['id']}")}],
         "validations": [{"op": "text_equals", "selector": _sel("cart-count"), "value": "3"}]},
        {"objective": "Open the cart: the three items and their total are listed",
         "actions": [{"op": "click", "selector": _sel("nav-cart")}],
         "validations": [{"op": "count", "selector": row, "equals": 3},
                         {"op": "text_contains", "selector": _sel("cart-total"), "value": f"${total:.2f}"}]},
        # the MIDDLE item: a wrong-item remove (last row, first row, a neighbour) leaves a different pair
        {"objective": f"Remove '{b['name']}' from the cart: '{a['name']}' and '{c['name']}' remain, total updated",
         "actions": [{"op": "click", "selector": _sel(f"remove-{b['id']}")}],
         "validations": [{"op": "count", "selector": row, "equals": 2},
                         {"op": "text_equals", "selector": _sel("cart-count"), "value": "2"},
                         {"op": "count", "selector": f"{row}:has-text(\"{a['name']}\")", "equals": 1},
                         {"op": "count", "selector": f"{row}:has-text(\"{c['name']}\")", "equals": 1},
                         {"op": "hidden", "selector": f"{row}:has-text(\"{b['name']}\")"},
                         {"op": "text_contains", "selector": _sel("cart-total"),
                          "value": f"${a['price'] + c['price']:.2f}"}]},
    ]


def _l3_cases(spec: dict[str, Any], dev: str) -> list[dict[str, Any]]:
    user, pw = f"{spec['category']}_{dev}", f"pw-{spec['seed']}-{dev}"
    n1, n2, n3 = spec["notes"]
    row = _sel("item-row")
    return [
        {"objective": f"Register the account {user} and land on the notes board",
         "actions": [{"op": "fill", "selector": _sel("register-user"), "value": user},
                     {"op": "fill", "selector": _sel("register-pass"), "value": pw},
                     {"op": "click", "selector": _sel("register-submit")}],
         "validations": [{"op": "text_contains", "selector": _sel("welcome"), "value": user}]},
        {"objective": f"Create the note '{n1}'",
         "actions": [{"op": "fill", "selector": _sel("new-title"), "value": n1},
                     {"op": "click", "selector": _sel("new-submit")}],
         "validations": [{"op": "count", "selector": row, "equals": 1},
                         {"op": "text_contains", "selector": _sel("items"), "value": n1}]},
        {"objective": f"Create the note '{n2}'",
         "actions": [{"op": "fill", "selector": _sel("new-title"), "value": n2},
                     {"op": "click", "selector": _sel("new-submit")}],
         "validations": [{"op": "count", "selector": row, "equals": 2}]},
        {"objective": f"Create the note '{n3}'",
         "actions": [{"op": "fill", "selector": _sel("new-title"), "value": n3},
                     {"op": "click", "selector": _sel("new-submit")}],
         "validations": [{"op": "count", "selector": row, "equals": 3}]},
        {"objective": "Reload the page: still logged in, the three notes persisted",
         "actions": [{"op": "reload"}],
         "validations": [{"op": "count", "selector": row, "equals": 3},
                         {"op": "text_contains", "selector": _sel("welcome"), "value": user}]},
        # the MIDDLE note: deleting the newest or the oldest instead leaves a different pair
        {"objective": f"Delete the note '{n2}': '{n1}' and '{n3}' remain",
         "actions": [{"op": "click", "selector": f"{row}:has-text(\"{n2}\") {_sel('delete')}"}],
         "validations": [{"op": "count", "selector": row, "equals": 2},
                         {"op": "count", "selector": f"{row}:has-text(\"{n1}\")", "equals": 1},
                         {"op": "count", "selector": f"{row}:has-text(\"{n3}\")", "equals": 1},
                         {"op": "hidden", "selector": f"{row}:has-text(\"{n2}\")"}]},
        {"objective": "Log out and log back in: two notes remain",
         "actions": [{"op": "click", "selector": _sel("logout")},
                     {"op": "fill", "selector": _sel("login-user"), "value": user},
                     {"op": "fill", "selector": _sel("login-pass"), "value": pw},
                     {"op": "click", "selector": _sel("login-submit")}],
         "validations": [{"op": "count", "selector": row, "equals": 2},
                         {"op": "text_contains", "selector": _sel("welcome"), "value": user}]},
        {"objective": "Log out: the login form is shown again",
         "actions": [{"op": "click", "selector": _sel("logout")}],
         "validations": [{"op": "visible", "selector": _sel("login-form")}]},
    ]


def workflows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for dev, (w, h) in VIEWPORTS.items():
        if spec["level"] == "L1":
            cases, protos = [], {f"home_{dev}": {"idx": 0, "fullpage": True}}
        elif spec["level"] == "L2":
            cases = _l2_cases(spec)
            protos = {f"home_{dev}": {"idx": 0, "fullpage": True}, f"about_{dev}": {"idx": 1, "fullpage": True},
                      f"cart_{dev}": {"idx": 4, "fullpage": True}}
        else:
            cases = _l3_cases(spec, dev)
            protos = {f"login_{dev}": {"idx": 0, "fullpage": True}, f"board_{dev}": {"idx": 3, "fullpage": True}}
        out.append({"summary": f"{spec['level']} {spec['category']} site '{spec['name']}' at {dev} {w}x{h}",
                    "resolution": {"width": w, "height": h}, "prototype": protos, "content": cases})
    return out


def prompt_text(spec: dict[str, Any]) -> str:
    """The task's prompt (prompt.txt for L1/L2, prd.md for L3): what to build and the page copy.

    The copy is given as text (an agent without OCR cannot read it from the prototypes); layout,
    colours and sizes are only in the prototype images."""
    lines = [f"Build the {spec['category']} website '{spec['name']}' shown in the prototypes "
             f"(desktop 1280, tablet 768, mobile 390 px wide). Mark interactive elements with the data-testid "
             f"values used in workflow.json.", "", "Copy:",
             f"- site name: {spec['name']}", f"- hero title: {spec['hero_title']}", f"- hero text: {spec['hero_text']}"]
    nav = {"L1": "Home, Shop, Contact", "L2": "Home, About, Cart (<number of items>)", "L3": "Notes"}[spec["level"]]
    lines.append(f"- navigation: {nav}")
    if spec["level"] in ("L1", "L2"):
        lines += [f"- item: {it['name']} | ${it['price']:.2f}" for it in spec["items"]]
    if spec["level"] == "L2":
        lines.append("- ui text: Add to cart | Your cart | Remove | Total: $<sum>")
    if spec["level"] == "L3":
        lines.append("- ui text: Create an account | Log in | user | password | Register | new note | Add note | "
                     "Delete | Log out | Welcome, <user>")
    if spec["level"] == "L2":
        lines += [f"- about title: {spec['about_title']}", f"- about text: {spec['about_text']}"]
    lines.append(f"- footer: {spec['footer']}")
    if spec["level"] == "L2":
        lines += ["", "Pages: home (hero + item cards with an 'Add to cart' button each), #/about, #/cart (rows with "
                  "name, price and a Remove button, then the total); the header shows the number of items in the cart."]
    if spec["level"] == "L3":
        lines += ["", "Full stack: registration, login, per-user notes stored in SQLite (create, list, delete), logout; "
                  "the session survives a page reload. Provide start.json that serves on 127.0.0.1:{port}."]
    return "\n".join(lines) + "\n"
