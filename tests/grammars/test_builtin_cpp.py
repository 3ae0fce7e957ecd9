"""The built-in grammars (``grammars.builtin``): C++ checked against HumanEval-X and g++, JSON
against Python's ``json``.

* Every HumanEval-X C++ task parses: ``prompt + canonical_solution + test`` (the program the
  HumanEval-X harness compiles), ``declaration + canonical_solution`` and that plus ``test``.
* Mutation study: each program mutated by deleting or duplicating one random lexical token (fixed
  seed). Of the mutants ``g++ -fsyntax-only`` rejects, the grammar must reject at least 90%; the
  rest are errors only name lookup or types find (``x`` undeclared, too few arguments). Every
  mutant g++ accepts, the grammar must accept. The default run takes 2 mutants a task; the
  ``bench`` one 10. g++ runs with a precompiled header of the standard headers the tasks include
  (the same verdicts as without it on the 648 mutants of a 4-a-task run, at half the CPU time).
* Hand-written programs cover what HumanEval's solutions do not use (lambdas, range-for, switch,
  templates, structs, casts, every literal form) and token sequences g++ rejects.

"Parses" means a matcher over a byte-level vocabulary (one token per byte) takes every byte and
then accepts. Timings are printed (``pytest -s``). Skips without ../shared or g++.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shutil
import string
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from shared_data import shared_path

from grammars import Compiler, GrammarError, TokenVocabulary, allocate_token_bitmask, builtin_grammar
from grammars.builtin import BUILTIN_GRAMMARS

BYTES = TokenVocabulary.from_bytes([bytes([b]) for b in range(256)] + [b""], eos_token_ids=[256])
GPP = shutil.which("g++")
WORKERS = min(4, os.cpu_count() or 2)  # g++ processes at once


def first_rejected(grammar, text: str) -> int:
    """-1 when ``grammar`` accepts ``text``; else the byte offset where it stops being a prefix
    (``len`` of the bytes when all of them are a prefix but not a sentence)."""
    data = text.encode()
    matcher = grammar.matcher()
    taken = matcher.try_advance(list(data))
    return -1 if taken == len(data) and matcher.is_accepting() else taken


def accepts(grammar, text: str) -> bool:
    return first_rejected(grammar, text) == -1


def where(text: str, offset: int) -> str:
    data = text.encode()
    before = data[max(0, offset - 120):offset].decode(errors="replace")
    return f"{before!r} >>> {data[offset:offset + 40].decode(errors='replace')!r}"


@pytest.fixture(scope="module")
def cpp():
    started = time.perf_counter()
    grammar = Compiler(BYTES).compile_lark(builtin_grammar("cpp"))
    print(f"\ncpp grammar: compiled in {time.perf_counter() - started:.2f}s ({grammar!r})")
    return grammar


@pytest.fixture(scope="module")
def humaneval() -> list[dict]:
    path = shared_path("humaneval-x", "humaneval_cpp.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def harness_program(task: dict) -> str:
    """What the HumanEval-X harness compiles for a solution: prompt, solution, test main."""
    return task["prompt"] + task["canonical_solution"] + task["test"]


# --- identifiers ------------------------------------------------------------------------------

#: C++'s reserved words and alternative tokens: IDENT in cpp.lark matches none of them.
KEYWORDS = """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
char16_t char32_t class compl concept const consteval constexpr constinit const_cast continue
co_await co_return co_yield decltype default delete do double dynamic_cast else enum explicit
export extern false float for friend goto if inline int long mutable namespace new noexcept not
not_eq nullptr operator or or_eq private protected public register reinterpret_cast requires
return short signed sizeof static static_assert static_cast struct switch template this
thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq""".split()

_WORD = string.digits + string.ascii_uppercase + string.ascii_lowercase + "_"


def _char_class(chars: set[str]) -> str:
    parts = []
    for group in (string.digits, string.ascii_uppercase, string.ascii_lowercase, "_"):
        run: list[str] = []
        for c in group + "\0":
            if c in chars:
                run.append(c)
                continue
            parts.extend([f"{run[0]}-{run[-1]}"] if len(run) >= 3 else run)
            run = []
    return "[" + "".join(parts) + "]"


def identifier_regex(keywords: list[str]) -> str:
    """``[A-Za-z_]\\w*`` minus ``keywords``, as a regex without lookaround (what cpp.lark's IDENT
    holds): walk the keywords' trie; leave it through any other character, then anything."""
    trie: dict = {}
    for word in keywords:
        node = trie
        for c in word:
            node = node.setdefault(c, {})
        node["$"] = {}

    def rest(node: dict, prefix: str) -> str:
        children = sorted(c for c in node if c != "$")
        others = set(_WORD if prefix else _WORD[10:]) - set(children)
        alternatives = [_char_class(others) + r"\w*"] if others else []
        alternatives += [c + rest(node[c], prefix + c) for c in children]
        body = "|".join(alternatives)
        if prefix and "$" not in node:  # a proper prefix of a keyword is an identifier
            return f"(?:{body})?"
        return f"(?:{body})" if len(alternatives) > 1 or not prefix else body

    return rest(trie, "")


def test_ident_is_the_identifiers_minus_the_keywords():
    match = re.search(r"^IDENT: /(.*)/$", builtin_grammar("cpp"), re.M)
    assert match, "cpp.lark has no IDENT line"
    assert match.group(1) == identifier_regex(KEYWORDS), "regenerate IDENT with identifier_regex(KEYWORDS)"
    ident = re.compile(match.group(1))
    for word in KEYWORDS:
        assert not ident.fullmatch(word), word
    for word in ["x", "i", "in", "int_", "int8", "main", "returns", "retur", "string", "_", "class_name", "Int",
                 "notx", "o", "andy", "do1", "size_t", "assert", "override", "final"]:
        assert ident.fullmatch(word), word
    rng = random.Random(7)
    for _ in range(20000):
        keyword = rng.choice(KEYWORDS)
        word = keyword[: rng.randint(1, len(keyword))] + "".join(rng.choice(_WORD) for _ in range(rng.randint(0, 2)))
        assert bool(ident.fullmatch(word)) == (word not in KEYWORDS), word


# --- HumanEval-X ------------------------------------------------------------------------------

#: Tasks whose ``declaration + canonical_solution`` is no program: CPP/38's declaration already
#: holds the start of decode_cyclic's body, and the solution repeats it (g++ rejects it too).
DECLARATION_NOT_A_PROGRAM = {"CPP/38"}


def test_every_humaneval_program_parses(cpp, humaneval):
    assert len(humaneval) == 164
    failures = []
    timings = []
    for task in humaneval:
        body = task["declaration"] + task["canonical_solution"]
        programs = {"prompt+solution+test": harness_program(task), "declaration+solution+test": body + task["test"],
                    "declaration+solution": body}
        for name, text in programs.items():
            started = time.perf_counter()
            offset = first_rejected(cpp, text)
            timings.append((time.perf_counter() - started, len(text.encode())))
            expected = not (name.startswith("declaration") and task["task_id"] in DECLARATION_NOT_A_PROGRAM)
            if (offset == -1) != expected:
                failures.append(f"{task['task_id']} {name}: " + (where(text, offset) if expected else "accepted"))
    seconds = sum(t for t, _ in timings)
    size = sum(n for _, n in timings)
    print(f"\ncpp grammar: {len(timings)} programs, {size} bytes in {seconds:.2f}s: "
          f"{1000 * seconds / len(timings):.1f} ms a program, {size / seconds / 1000:.0f} KB/s")
    assert not failures, "\n".join(failures)


# --- the mutation study -----------------------------------------------------------------------

_LEXEME = re.compile(
    r"""
    (?P<skip>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<header>(?<=include)\s*<[^>\n]*>)
  | (?P<token>(?:u8|[uUL])?"(?:[^"\\\n]|\\.)*"
        | (?:u8|[uUL])?'(?:[^'\\\n]|\\.)*'
        | \.?[0-9](?:[eEpP][+-]|[0-9A-Za-z_.'])*
        | [A-Za-z_]\w*
        | >>=|<<=|->\*|\.\.\.|<=>|::|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|\.\*|\#\#
        | \S)
    """,
    re.X | re.S,
)


def lexemes(text: str) -> list[tuple[int, int]]:
    """(start, end) of each C++ token of ``text`` (comments and blanks skipped; an include's
    ``<header>`` is one token, as in translation phase 3)."""
    spans = []
    pos = 0
    while pos < len(text):
        match = _LEXEME.match(text, pos)
        assert match, f"cannot lex {text[pos:pos + 20]!r}"
        if match.lastgroup == "token":
            spans.append(match.span())
        elif match.lastgroup == "header":
            spans.append((match.end() - len(match.group().lstrip()), match.end()))
        pos = match.end()
    return spans


def test_lexemes():
    text = '#include<stdio.h>\nint main(){ return a+=1.5e-3f; } // x\n/* y */ s="a\\"b";'
    assert [text[s:e] for s, e in lexemes(text)] == [
        "#", "include", "<stdio.h>", "int", "main", "(", ")", "{", "return", "a", "+=", "1.5e-3f", ";", "}",
        "s", "=", '"a\\"b"', ";"]


def mutants(text: str, rng: random.Random, count: int) -> list[tuple[str, str, str]]:
    """``count`` mutants of ``text``, alternately deleting and duplicating a random token: (kind,
    token, mutant). A deleted token leaves a blank and a copy follows a blank, so neighbouring
    tokens never fuse into a different one."""
    spans = lexemes(text)
    out = []
    for k in range(count):
        start, end = spans[rng.randrange(len(spans))]
        token = text[start:end]
        if k % 2 == 0:
            out.append(("delete", token, text[:start] + " " + text[end:]))
        else:
            out.append(("duplicate", token, text[:end] + " " + token + text[end:]))
    return out


#: the standard headers HumanEval-X's programs include (but assert.h, which NDEBUG governs)
PCH_HEADERS = ("stdio.h", "stdlib.h", "math.h", "string", "vector", "algorithm", "map", "list")


@pytest.fixture(scope="module")
def gpp(tmp_path_factory):
    """``verdict(text) -> bool``: whether ``g++ -fsyntax-only`` accepts ``text``, with a
    precompiled header of ``PCH_HEADERS`` when one can be built."""
    if GPP is None:
        pytest.skip("g++ not found: comparing with g++ needs g++ -fsyntax-only")
    header = tmp_path_factory.mktemp("pch") / "std.h"
    header.write_text("".join(f"#include <{h}>\n" for h in PCH_HEADERS))
    built = subprocess.run([GPP, "-x", "c++-header", str(header), "-o", str(header) + ".gch"], capture_output=True)
    pre = ["-include", str(header)] if built.returncode == 0 else []

    def verdict(text: str) -> bool:
        run = subprocess.run([GPP, "-fsyntax-only", *pre, "-x", "c++", "-"], input=text.encode(), capture_output=True)
        return run.returncode == 0

    return verdict


def mutation_study(cpp, humaneval, gpp, per_task: int, seed: int = 2024) -> None:
    programs = {task["task_id"]: harness_program(task) for task in humaneval}
    with ThreadPoolExecutor(WORKERS) as pool:
        originals = dict(zip(programs, pool.map(gpp, programs.values())))
        compiled = [tid for tid, ok in originals.items() if ok]
        skipped = sorted(set(programs) - set(compiled))  # e.g. boost/any.hpp not installed
        cases = [(tid, *m) for tid in compiled
                 for m in mutants(programs[tid], random.Random(f"{seed}:{tid}"), per_task)]
        started = time.perf_counter()
        verdicts = list(pool.map(gpp, [mutant for *_, mutant in cases]))
        gpp_seconds = time.perf_counter() - started
    assert [tid for tid in compiled if not accepts(cpp, programs[tid])] == []
    started = time.perf_counter()
    ours = [accepts(cpp, mutant) for *_, mutant in cases]
    our_seconds = time.perf_counter() - started
    rejected = [c for c, g in zip(cases, verdicts) if not g]
    caught = sum(1 for g, o in zip(verdicts, ours) if not g and not o)
    wrongly_rejected = [c for c, g, o in zip(cases, verdicts, ours) if g and not o]
    missed = [f"{tid} {kind} {token!r}" for (tid, kind, token, _), g, o in zip(cases, verdicts, ours) if not g and o]
    rate = caught / len(rejected)
    print(f"\nmutation study ({per_task} a task, {len(compiled)} tasks, seed {seed}; g++ cannot compile "
          f"{skipped} as given here): {len(cases)} mutants, g++ rejects {len(rejected)}, the grammar rejects "
          f"{caught} of those ({rate:.1%}); g++ accepts {len(cases) - len(rejected)}, the grammar rejects "
          f"{len(wrongly_rejected)} of those. g++ {gpp_seconds:.1f}s ({WORKERS} processes), grammar "
          f"{our_seconds:.1f}s.\ng++-rejected mutants the grammar accepts: {', '.join(missed)}")
    assert rate >= 0.90, f"the grammar rejects only {rate:.1%} of the mutants g++ rejects"
    assert not wrongly_rejected, "mutants g++ accepts but the grammar rejects:\n" + "\n".join(
        f"{tid} {kind} {token!r}: {where(mutant, first_rejected(cpp, mutant))}"
        for tid, kind, token, mutant in wrongly_rejected)


def test_mutants(cpp, humaneval, gpp):
    mutation_study(cpp, humaneval, gpp, per_task=2)


@pytest.mark.bench
def test_mutants_bench(cpp, humaneval, gpp):
    mutation_study(cpp, humaneval, gpp, per_task=10, seed=99)


# --- hand-written programs --------------------------------------------------------------------

FEATURES = r"""#include <bits/stdc++.h>
#include "stdio.h"
#define MOD 1000000007
#define SQ(x) ((x) * (x))
#pragma once
using namespace std;
using std::vector;
typedef long long ll;
typedef pair<int, int> pii;
using vi = vector<int>;
const int N = 1e5 + 5;
static long long memo[100];
struct Point {
    int x, y;
    Point() : x(0), y(0) {}
    Point(int a, int b) : x(a), y{b} {}
    bool operator<(const Point& o) const { return x < o.x || (x == o.x && y < o.y); }
    int sum() const noexcept { return x + y; }
};
class Counter {
public:
    explicit Counter(int start) : n(start) {}
    virtual ~Counter() = default;
    int next() { return n++; }
    static int zero() { return 0; }
private:
    int n;
};
enum Color { RED, GREEN = 2, BLUE };
enum class Dir : int { Up, Down };
template <typename T>
T maximum(const vector<T>& v) {
    T best = v[0];
    for (const auto& x : v) if (x > best) best = x;
    return best;
}
int gcd(int a, int b);
int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }
auto twice(int x) -> int { return 2 * x; }
unsigned long long big = 18446744073709551615ULL;
double eps = 1e-9, half = .5, third = 1.0 / 3, f = 2.5f;
int hex = 0xFF, bin = 0b1010, sep = 1'000'000;
char c = '\n', q = '\'', bs = '\\', nul = '\0';
const char* s = "tab\there \"quoted\" \\ end";
string joined = "ab" "cd";
auto lam = [](int a, int b) -> bool { return a > b; };
vector<vector<int>> grid(3, vector<int>(4, 0));
map<string, int> counts;
unordered_map<int, vector<pair<int, int>>> adj;
int main(int argc, char** argv) {
    vector<int> v = {5, 3, 1, 4};
    sort(v.begin(), v.end(), greater<int>());
    sort(v.begin(), v.end(), [&](int a, int b) { return a < b; });
    int total = 0;
    for (int i = 0, j = (int)v.size() - 1; i < j; ++i, --j) total += v[i] * v[j];
    for (auto it = v.begin(); it != v.end(); it++) *it <<= 1;
    map<string, int>::iterator mit = counts.find("x");
    if (mit != counts.end() and not counts.empty()) total--;
    else if (total > 0) { total = -total; }
    else total = ~total;
    if (auto it = counts.find("y"); it != counts.end()) total++;
    int k = 0;
    do { k++; } while (k < 10);
    do k--; while (k > 5);
    while (k) k >>= 1;
    switch (k) {
        case 0: total += 1; break;
        case 'a': case -1: { total += 2; } break;
        default: break;
    }
    ll x = static_cast<ll>(total) * 2LL;
    double d = (double)x / 3;
    long long y = (long long)d;
    int* p = new int[10];
    delete[] p;
    Point* pt = new Point(1, 2);
    int sx = pt->x + (*pt).y;
    delete pt;
    size_t n = sizeof(int) + sizeof x;
    bool ok = !(x > 0) || (y & 1) == 0 && (x ^ y) != 0;
    int z = ok ? 1 : 2;
    z = z % 3 + (z << 2) - (z >> 1) | 4;
    z |= 1; z &= ~2; z ^= 3; z %= 7; z *= 2; z /= 2; z -= 1;
    auto [a, b] = make_pair(1, 2);
    pair<int, int> pr = {3, 4};
    int m = max({1, 2, 3});
    vector<int> w{1, 2, 3};
    string str = to_string(a + b);
    str += 'x';
    str = string(3, 'y') + str.substr(0, 2);
    int arr[5] = {0};
    int mat[2][3] = {{1, 2, 3}, {4, 5, 6}};
    try { throw runtime_error("boom"); } catch (const exception& e) { cout << e.what() << endl; } catch (...) {}
    if (str.find('q') == string::npos) cout << "none" << "\n";
    int t = ::abs(-3) + std::abs(-4) + numeric_limits<int>::max() % 10;
    function<int(int)> fib = [&](int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); };
    int cnt = count_if(v.begin(), v.end(), [](int q) { return q % 2 == 0; });
    transform(str.begin(), str.end(), str.begin(), ::tolower);
    for (auto& [key, val] : counts) val++;
    for (int e : {1, 2, 3}) total += e;
    assert(total >= 0 || true);
    Color col = GREEN;
    Dir dd = Dir::Up;
    unsigned int u = 3u;
    unsigned char uc = 200;
    long double ld = 1.0L;
    short sh = 1;
    const int& ref = total;
    int&& rr = 5;
    int ** pp = nullptr;
    printf("%d %s\n", total, str.c_str());
    return 0;
}
"""

#: the C++ an LLM writes for such tasks (std:: everywhere, <algorithm>, lambdas, structured bindings)
MODERN = r"""#include <bits/stdc++.h>
#include <regex>
using ll = long long;
namespace {
int helper(int v) { return v * 2; }
}
struct Node {
    int val;
    Node* next;
    Node(int v) : val(v), next(nullptr) {}
};
struct ByLen {
    bool operator()(const std::string& a, const std::string& b) const { return a.size() < b.size(); }
};
template <class T>
void print_all(const std::vector<T>& xs) {
    for (const T& x : xs) std::cout << x << ' ';
    std::cout << '\n';
}
static bool cmp(const int& a, const int& b) { return __builtin_popcount(a) < __builtin_popcount(b); }
std::vector<std::string> split_words(const std::string& s) {
    std::stringstream ss(s);
    std::string word;
    std::vector<std::string> out;
    while (ss >> word) out.push_back(word);
    std::string item;
    std::stringstream ss2(s);
    while (std::getline(ss2, item, ',')) out.emplace_back(item);
    return out;
}
int main() {
    std::vector<std::string> result;
    std::string s = "Hello, World";
    for (size_t i = 0; i < s.size(); ++i) {
        if (std::isalpha(static_cast<unsigned char>(s[i]))) s[i] = std::tolower(s[i]);
    }
    std::vector<std::pair<int, int>> arr = {{1, 2}, {3, 1}};
    std::sort(arr.begin(), arr.end(), [](const std::pair<int, int>& a, const std::pair<int, int>& b) { return a.second > b.second; });
    std::vector<int> v(10);
    std::iota(v.begin(), v.end(), 0);
    long long total = std::accumulate(v.begin(), v.end(), 0LL);
    std::string rev(s.rbegin(), s.rend());
    std::unordered_set<char> seen;
    int n = static_cast<int>(s.length());
    std::priority_queue<int, std::vector<int>, std::greater<int>> pq;
    std::map<char, int> freq;
    for (char ch : s) freq[ch]++;
    for (auto const& [k, cnt] : freq) total += cnt;
    std::array<int, 26> counts{};
    std::tuple<int, int, int> t = std::make_tuple(1, 2, 3);
    auto [x, y, z] = t;
    int first = std::get<0>(t);
    double avg = static_cast<double>(total) / n;
    const std::string vowels = "aeiouAEIOU";
    if (vowels.find(s[0]) != std::string::npos) total++;
    std::vector<int>::size_type sz = v.size();
    std::cout << std::fixed << std::setprecision(2) << avg << std::endl;
    std::function<bool(int)> isOdd = [](int q) { return q % 2 != 0; };
    auto mx = *std::max_element(v.begin(), v.end()) - v.front();
    long idx = std::max_element(v.begin(), v.end()) - v.begin();
    std::vector<int> dp(n + 1, INT_MAX);
    std::string one = std::string(1, 'c') + "x";
    if (!s.empty() && s.back() == ' ') s.pop_back();
    std::vector<std::vector<int>> grid(n, std::vector<int>(3));
    x = (x << 1) | 1;
    auto bits = std::bitset<32>(n).count();
    std::sort(v.begin(), v.end(), std::greater<>());
    std::set<int>::iterator it = std::set<int>{1, 2, 3}.begin();
    std::vector<std::string> words{"a", "b"};
    const auto m2 = v.size();
    constexpr double PI = 3.14159;
    s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
    int a = 0, b = 1, c;
    unsigned long long big = 0ULL;
    int i2 = 0, j2 = 10;
    i2 += 2, j2 -= 1;
    int r = a ? b : c ? 1 : 2;
    x = -~x;
    std::regex re("[0-9]+");
    std::vector<bool> flags(n, false);
    int64_t w = (int64_t)n + uint64_t(3) + (std::size_t)2;
    int cnt2[26] = {};
    std::map<std::string, std::vector<int>> groups;
    std::ostringstream oss;
    oss << total;
    for (char& ch : s) ch = std::toupper(ch);
    Node* head = new Node(0);
    std::vector<Node*> nodes{head};
    std::unique_ptr<Node> owned = std::make_unique<Node>(1);
    std::tie(a, b) = std::make_pair(1, 2);
    std::set<std::string, ByLen> byLen;
    std::string raw = R"(a "raw" \ string)";
    auto it2 = std::find_if(v.begin(), v.end(), [&](const auto& p) { return p == first; });
    bool digits = std::all_of(s.begin(), s.end(), ::isdigit);
    s.push_back(char('0' + 5));
    int d = int(s[0] - '0');
    double inf = std::numeric_limits<double>::infinity();
    int tcase = 3;
    while (tcase--) { total += helper(tcase); }
    try { if (n < 0) throw std::invalid_argument("bad"); } catch (std::exception& e) { return 1; }
    print_all(v);
    std::sort(v.begin(), v.end(), cmp);
    return (int)(total % 7) * 0;
}
"""

DENSE = """/* no includes, no blanks where none are needed */
int f(int x){return x?-x:x;}
int g(int n){int s=0;for(;;){if(n<=0)break;s+=n--;continue;}return s;}
int h(){return(1);}
int k(){return-1;}
int l(){return!0;}
char m(){return'a';}
const char*n2(){return"s";}
int o(int*a){return*a;}
int main(){int i=0,*pi=&i,&ri=i;i++;++i;i--;--i;i=-i;i=+i;i=- -i;return f(i)+g(3)&&h()||k();}
// a last comment without a newline"""


@pytest.mark.parametrize("text", [FEATURES, MODERN, DENSE], ids=["features", "modern", "dense"])
def test_programs_beyond_humaneval(cpp, text):
    offset = first_rejected(cpp, text)
    assert offset == -1, where(text, offset)


BODY = "#include <vector>\nusing namespace std;\nint f(int x, vector<int> v) {\n%s\n}\n"

#: statements g++ rejects for their syntax (not for names or types)
NOT_CPP = [
    "int int x = 1; return x;", "const const int y = 1; return y;", "unsigned unsigned y = 1; return y;",
    "long long long y = 1; return y;", "return x x;", "return x +;", "if x return 1; return 0;",
    "for (int i = 0; i < 3; i++ return 0;", "return (x;", "return x);", "int y = 1 return y;",
    "if (x) return 1; elsereturn 2;", "return 0x;", "return 1e;", "return 'ab;", 'return "abc;',
    "x = = 1; return x;", "return x <> 1;", "int y[ = 1; return 0;", "vector<int> w = {1, 2,, 3}; return 0;",
    "return x and and x;", "return x andx;", "return static_cast<int>x;", "return (x) y;",
    "do x++ while (x < 3); return x;", "switch (x) { case: return 1; } return 0;", "break return 0;",
    "return x ? 1 2;", "int y = x +/ 2; return y;", "return v..size();", "return v.->size();",
    "auto l = [](int a { return a; }; return 0;", "return sizeof;", "return 1 2;", "int y = (int); return y;",
    "/* unterminated comment", "return x; }", "{ return x;", "return x; #include <map>",
]


@pytest.mark.parametrize("body", NOT_CPP)
def test_rejects_what_gpp_rejects(cpp, body):
    assert not accepts(cpp, BODY % body)


def test_hand_written_programs_are_what_gpp_says(gpp):
    """FEATURES, MODERN and DENSE are C++, and NOT_CPP's statements are not."""
    texts = [FEATURES, MODERN, DENSE] + [BODY % body for body in NOT_CPP]
    with ThreadPoolExecutor(WORKERS) as pool:
        verdicts = list(pool.map(gpp, texts))
    assert verdicts[:3] == [True, True, True]
    assert [body for body, ok in zip(NOT_CPP, verdicts[3:]) if ok] == []


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("intf(){return 1;}\n", False),  # words never run together...
        ("doublex = 1.0;\n", False),
        ("unsigned longlong x;\n", False),
        ("int main(){int x;}\n", True),
        ("int main(){return 0;}\n", True),
        ("int/**/x;\n", True),  # ...and a comment separates them
        ("#include <vector>\n#include<map> // maps\n#undef NDEBUG\n", True),  # directives are whole lines
        ("int x; #include <map>\n", False),
        ("int x; /* c */ #include <map>\n", False),
        ("int x; // c\n#include <map>\nint y;\n", True),
        ("#include <vector> junk\n", True),  # g++ warns about extra tokens but accepts them
        ("#include <vector>junk\n", False),
        ("#include <std vector>\n", False),
        ("#include <.h>\n", False),
        ("# <vector>\n", False),
        ("#\n", True),
        ("main(){}\n", True),  # g++ accepts main without a type (a warning)
        ("f(){}\n", False),
        ("int f(){\n#ifdef X\n  return 1;\n#else\n  return 2;\n#endif\n}\n", True),
        ("int f(){ #pragma once\n}\n", False),
        ("int x = 07, y = 0, z = 0x1F, w = 0b1, q = 10;\n", True),
        ("int x = 08;\n", False),
        ("int x = a--b;\n", True),  # read as a - -b, where g++'s lexer sees a -- b
    ],
)
def test_words_and_lines(cpp, text, ok):
    assert accepts(cpp, text) == ok


def test_real_vocabulary(humaneval):
    """The grammar with a code model's tokenizer: a HumanEval program's tokens are each allowed,
    the masks hold them, and the program ends in an accepting state."""
    vocab = TokenVocabulary.from_gguf(shared_path("vocab", "ggml-vocab-deepseek-coder.gguf"))
    started = time.perf_counter()
    grammar = Compiler(vocab).compile_lark(builtin_grammar("cpp"))
    compiled = time.perf_counter() - started
    text = harness_program(humaneval[0])
    ids = vocab.encode(text)
    assert vocab.decode(ids) == text.encode()
    matcher = grammar.matcher()
    mask = allocate_token_bitmask(1, vocab.logits_width)
    started = time.perf_counter()
    for step, token in enumerate(ids):
        if step in (0, len(ids) // 2, len(ids) - 1):
            matcher.fill_mask(mask, 0)
            assert (int(mask[0, token // 32]) >> (token % 32)) & 1, step
        matcher.advance(token)
    assert matcher.is_accepting()
    print(f"\ncpp grammar with deepseek-coder ({len(vocab)} tokens): compiled in {compiled:.2f}s; "
          f"{len(ids)} tokens and 3 masks in {time.perf_counter() - started:.2f}s")


# --- JSON and the registry --------------------------------------------------------------------


@pytest.fixture(scope="module")
def json_grammar():
    return Compiler(BYTES).compile_lark(builtin_grammar("json"))


def python_accepts(text: str) -> bool:
    def no_constants(name: str):
        raise ValueError(name)  # NaN, Infinity: Python's extensions, not JSON

    try:
        json.loads(text, parse_constant=no_constants)
    except ValueError:
        return False
    return True


JSON_TEXTS = [
    "{}", "[]", "0", "-0", "-0.0E+1", "1e5", "12.5e-3", '"é😀"', " [1, 2.5e-3, true, false, null] ",
    '{"a": {"b": [null, {"c": "d"}]}, "e": "\\u00e9\\n\\"\\\\\\/"}', '"\\ud800"', "\n\t\r 7 \n",
    "01", "1.", ".5", "+1", "-", "1e", "[1,]", "[,]", '{"a" 1}', '{"a":1,}', "{1: 2}", '"\x01"', '"\\x"',
    '"\\u12g4"', "nul", "True", "[1 2]", "1 2", '"a""b"', "", " ", "NaN", "Infinity", '"\t"', "[", "]",
    '{"a":[}', "'a'",
]


@pytest.mark.parametrize("text", JSON_TEXTS)
def test_json_agrees_with_python(json_grammar, text):
    assert accepts(json_grammar, text) == python_accepts(text)


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 5)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind == 1:
        return rng.randint(-10**6, 10**6)
    if kind == 2:
        return rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-30, 30)
    if kind in (3, 4):
        return "".join(rng.choice('ab "\\\n\té€😀\x01/') for _ in range(rng.randint(0, 6)))
    if kind == 5:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {"".join(rng.choice('k"é\\') for _ in range(rng.randint(0, 3))): random_json(rng, depth + 1)
            for _ in range(rng.randint(0, 4))}


def test_json_agrees_with_python_on_random_documents(json_grammar):
    rng = random.Random(11)
    for _ in range(150):
        value = random_json(rng)
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 0, 2]))
        assert accepts(json_grammar, text), text
        cut = rng.randrange(len(text))  # delete or duplicate one character
        for mutant in (text[:cut] + text[cut + 1:], text[:cut + 1] + text[cut:]):
            assert accepts(json_grammar, mutant) == python_accepts(mutant), mutant


def test_registry():
    assert BUILTIN_GRAMMARS == ("cpp", "json")
    folder = Path(__file__).resolve().parents[2] / "grammars" / "builtin"
    assert sorted(p.stem for p in folder.glob("*.lark")) == sorted(BUILTIN_GRAMMARS)
    for name in BUILTIN_GRAMMARS:
        assert builtin_grammar(name) == (folder / f"{name}.lark").read_text(encoding="utf-8")
    with pytest.raises(GrammarError, match="known: cpp, json") as caught:
        builtin_grammar("python")
    assert isinstance(caught.value, ValueError)
    with pytest.raises(TypeError):
        builtin_grammar(None)  # type: ignore[arg-type]
