"""Strings in each benchmark grammar's language, walked token by token by the grammar benchmark.

``GBNF_SAMPLES`` maps a grammar file stem in ``shared/gbnf/`` to a few realistic strings (50–500
characters) that the grammar derives *exactly* — read as a character-level CFG, the way llama.cpp
reads GBNF. Several are chosen to hit known traps:

- ``arithmetic``: ``ws ::= [ \\t\\n]*`` sits right before the literal ``"\\n"``, so a greedy lexer
  that lets ``ws`` swallow the newline rejects ``1+2*(3-4)/5=x\\n``; the grammar allows no space
  *after* an operator, only after a term.
- ``c``: ``ws`` is mandatory (``[ \\t\\n]+``) around ``=``, after ``return`` and inside ``( ... )``,
  and forbidden between statements, so these read like minified C.
- ``json``: ``ws`` is at most one space or a newline plus up to 20 spaces/tabs; the exponent is
  ``[0-9] [1-9]{0,15}``, so ``1e10`` is *not* in the language (``2.5e-3`` is).
- ``json_arr``: the root array opens with ``"[\\n"``, separates with ``",\\n"`` and ends without
  trailing whitespace; its exponent is ``[1-9] [0-9]{0,15}``.
- ``english``/``japanese``: words separated by exactly one space, tab or newline, nothing trailing.

``REGEXES`` and ``REGEX_SAMPLES`` do the same for a few regular expressions (full match).
Every string here must be in its language: a mask that rejects one of its tokens is an engine bug
("rejected valid" in the benchmark table), never a harness quirk.
"""

from __future__ import annotations

__all__ = ["GBNF_SAMPLES", "REGEXES", "REGEX_SAMPLES"]

GBNF_SAMPLES: dict[str, list[str]] = {
    "arithmetic": [
        "1+2*(3-4)/5=x\n((1+2)*3)/4 = 2\nprice*quantity+tax= total\n",
        "(a+b)*(a-b)= (a*a-b*b)\nx_1*2+y_2*3=z\nspeed*time=distance\nwidth*height\t= area\n",
        "100/4+7*(2-1)= result_1\ncount+1=\n\tnext\n(rate*(hours+overtime))/12 = monthly\n",
    ],
    "c": [
        "int factorial(int n){if(n<=1){return 1;}return n*factorial(n-1);}",
        "int gcd(int a){int b = 48;while(b!=0){int t = b;b = a-a/b*b;a = t;}return a;}",
        "float average(int n){float sum = 0;for(int i = 0; i<n; i = i+1)"
        "{sum = sum+sample(i);}return sum/n;}",
        "int main(){// count down from ten\nint i = 10;while(i>0){print (i);i = i-1;}"
        "/* done counting */return 0;}",
        "char grade(int score){if(score>=90){return 65;}else{if(score>=80){return 66;}}"
        "return ( score-score/10*10 )+67;}int square(int x){return x*x;}"
        "int negate(int x){return -x;}",
    ],
    "json": [
        '{"name": "Alice Martin", "age": 34, "email": "alice@example.com", '
        '"is_active": true, "tags": ["admin", "editor"], "manager": null}',
        '{\n  "id": 1027,\n  "title": "Caf\u00e9 menu \\u2014 spring",\n  "price": 12.5,\n'
        '  "ratio": -0.25,\n  "scale": 2.5e-3,\n  "items": [\n    {\n      "sku": "A-1",\n'
        '      "qty": 3\n    },\n    {\n      "sku": "B-7",\n      "qty": 1\n    }\n  ],\n'
        '  "notes": "line one\\nline two \\"quoted\\""\n}',
        '{"type":"FeatureCollection","features":[{"type":"Feature","geometry":{"type":"Point",'
        '"coordinates":[2.3522,48.8566]},"properties":{"city":"Paris","population":2161000,'
        '"capital":true,"aliases":[]}}],"metadata":{}}',
    ],
    "json_arr": [
        '[\n{"id": 1, "name": "pen", "price": 1.25},\n{"id": 2, "name": "notebook", '
        '"price": 3.5},\n{"id": 3, "name": "eraser", "price": 0.75}\n]',
        '[\n"alpha",\n"beta",\n 42,\n-7.5e12,\ntrue,\nnull,\n[1, 2, [3, 4]],\n'
        '{"nested": {"deep": {"value": "ok"}}}]',
        '[\n{\n  "user": "bob",\n  "roles": [\n    "viewer"\n  ],\n  "quota": 1024\n},\n'
        '{\n  "user": "carol",\n  "roles": [],\n  "quota": 2048\n}\n]',
    ],
    "chess": [
        # Morphy's Opera Game (Paris, 1858), to move 16.
        "1. e4 e5\n2. Nf3 d6\n3. d4 Bg4\n4. dxe5 Bxf3\n5. Qxf3 dxe5\n6. Bc4 Nf6\n"
        "7. Qb3 Qe7\n8. Nc3 c6\n9. Bg5 b5\n10. Nxb5 cxb5\n11. Bxb5+ Nbd7\n"
        "12. O-O-O Rd8\n13. Rxd7 Rxd7\n14. Rd1 Qe6\n15. Bxd7+ Nxd7\n16. Qb8+ Nxb8\n",
        # Ruy Lopez, closed main line.
        "1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6\n4. Ba4 Nf6\n5. O-O Be7\n6. Re1 b5\n"
        "7. Bb3 d6\n8. c3 O-O\n9. h3 Nb8\n10. d4 Nbd7\n11. c4 c6\n12. cxb5 axb5\n",
        # Pawn race ending in promotions with check.
        "1. a4 h5\n2. a5 h4\n3. a6 h3\n4. axb7 hxg2\n5. bxa8=Q gxh1=Q\n"
        "6. Qxb8 Qxg1+\n7. Ke2 Qxf2+\n8. Kxf2 Rh3\n9. Qxc8# Kd8\n",
    ],
    "english": [
        "The quick brown fox jumps over the lazy dog. It's 5 o'clock (roughly) -- time for tea!",
        "Dear team,\nthe release is scheduled for 2024-06-01 at 09:30 UTC.\n"
        "Please review PR #1234 and report issues to ops@example.com; thanks!",
        "Q: What is 7*6?\tA: 42. [See \"The Hitchhiker's Guide\", ch. 1; cf. {notes} & "
        "footnotes ~p.3.]",
    ],
    "japanese": [
        "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。"
        "何でも薄暗いじめじめした所でニャーニャー泣いていた事だけは記憶している。",
        "今日は良い天気ですね。\n散歩に行きましょう。 東京タワーへ行きます。\n"
        "帰りに駅前の喫茶店でコーヒーを飲みましょうか。",
        "コンピューターの研究室で、新しいプログラムを書いています。\n明日、会議があります。"
        "資料は「設計書」と「試験結果」の二つです。",
    ],
    "list": [
        "- buy milk\n- call the bank about the mortgage\n- finish the quarterly report\n",
        "- Preheat the oven to 200 °C.\n- Mix flour, sugar & eggs (2 large).\n"
        "- Bake for 25–30 minutes; let it cool.\n",
        "- 東京\n- Zürich\n- São Paulo\n- New York, NY 10001\n- \"quoted item\" with\ttab\n",
    ],
}

REGEXES: dict[str, str] = {
    "email": r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}",
    "date": r"\d{4}-\d{2}-\d{2}",
    "phone": r"(\+1 )?\(?[0-9]{3}\)?[ -]?[0-9]{3}-[0-9]{4}",
    "word_list": r"[a-z]+(, [a-z]+)*",
    "iso_datetime": r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})",
}

REGEX_SAMPLES: dict[str, list[str]] = {
    "email": ["alice.martin@example.com", "john.doe+newsletter@mail.example.co.uk", "x_y%z@sub-domain.io"],
    "date": ["2024-06-01", "1999-12-31", "2000-02-29"],
    "phone": ["(555) 123-4567", "+1 555-867-5309", "212 555-0100"],
    "word_list": [
        "apples, bananas, cherries, dates, elderberries, figs, grapes",
        "red, green, blue",
        "alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa, lambda, mu",
    ],
    "iso_datetime": ["2024-06-01T09:30:00Z", "1999-12-31T23:59:59.123456+05:30", "2000-02-29T00:00:00-08:00"],
}
