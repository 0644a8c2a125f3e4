// GBNF parsing and grammar-constrained token masks (arbiter/engine/grammar.h).
//
// Note [Grammar matching]
// Parse desugars the GBNF text into plain rules: every parenthesised group
// and every repetition becomes a generated rule (X* → R ::= X R | ε;
// X{m,n} → m copies of X, then n−m nested optionals; X+ → X X*), and every
// literal character, class and `.` becomes a character set (sorted code
// point ranges, surrogates removed). The rules are flattened into one array
// of elements, each alternative ending in an END element; a *position* is an
// index into that array.
//
// A parse stack is a list of positions (bottom first): the top is the
// character set the next code point must match; the entries below are
// where to continue when the rule above them ends. Expanding a position
// that refers to a rule replaces it with its successor (omitted when that
// is END: tail calls do not grow the stack, so `R ::= X R | ε` runs in
// constant depth) and pushes one new stack per alternative. The matcher's
// state is the set of distinct stacks after expansion (an empty stack means
// the output so far is complete) plus a partial UTF-8 sequence: bytes of a
// code point not yet finished. While a sequence is partial the stacks stay
// as they are, and a stack survives only if its top set intersects the code
// point range the prefix can still become (exact, since sets hold no
// surrogates and the range is clamped to exclude overlong forms).
// Left recursion would make expansion loop, so Parse rejects it.
//
// FillAllowed walks the vocabulary's byte trie depth first: a child whose
// byte kills every stack is not entered, so each allowed prefix is advanced
// once however many tokens share it.
//
// Note [Transition cache]
// Most trie nodes lead to a state the walk has already met: inside a JSON
// string every ordinary character returns to the very same stack set. So
// the matcher interns states (equal stacks and partial UTF-8 → one id) and
// keeps, per state, its 256 byte transitions (next id, dead, or unknown)
// and its MinToEnd. A node then costs an array lookup unless its
// (state, byte) pair is new. The cache lives as long as the constraint and
// is dropped whole when it holds kMaxCachedStates states (checked at the
// start of FillAllowed), which bounds it to about 1.1 MB.
//
// Note [Mask cache]
// The viable tokens of a state (each with the shortest completion after it)
// depend on the state alone; the budget only selects among them. So the
// last kMaxCachedMasks start states keep their lists, and a step that starts
// in one of them — every step of a model rambling inside a JSON string —
// skips the trie walk and only filters the list by the budget. A list holds
// 8 bytes per viable token (about 1.2 MB for a 150 k vocabulary inside a
// string), so the cache is small and per constraint.
//
// Note [Length-aware masking]
// min_bytes(set) is the UTF-8 length of its smallest code point;
// rule_min is the fixed point min over alternatives of Σ element costs
// (computed in increasing order, Knuth's generalisation of Dijkstra);
// suffix_min[p] is the cost of the rest of p's alternative from p on. A
// stack's total Σ suffix_min over its positions is the fewest bytes that
// complete it, kept beside the stack; the state's minimum over stacks (plus
// the bytes a partial code point still needs) is MinCharsToEnd. FillAllowed
// allows a viable token only when its state's minimum is ≤ tokens_left − 1,
// which the single byte token of the shortest path always satisfies: the
// invariant "MinCharsToEnd ≤ tokens_left" then holds at every step and the
// output is complete when the budget ends. Each interned state's minimum is
// computed once (Note [Transition cache]), so the check is one comparison
// per viable token and there is nothing to gain by skipping it when the
// budget is large.
#include "arbiter/engine/grammar.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <queue>
#include <unordered_map>
#include <utility>

namespace arbiter {
namespace grammar_internal {

constexpr int32_t kInf = 1 << 28;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxStacks = 512;
constexpr int kMaxStackDepth = 512;
constexpr int kMaxExpansion = 4096;
constexpr size_t kMaxTokenBytes = 1024;

int Utf8Len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

struct CharSet {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // sorted, disjoint, inclusive
  uint64_t ascii[2] = {0, 0};                        // bit c set: code point c < 128 matches
  int min_bytes = kInf;

  bool Match(uint32_t cp) const {
    if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
    for (const auto& r : ranges) {
      if (cp < r.first) return false;
      if (cp <= r.second) return true;
    }
    return false;
  }
  bool Intersects(uint32_t lo, uint32_t hi) const {
    for (const auto& r : ranges) {
      if (r.first <= hi && lo <= r.second) return true;
    }
    return false;
  }
};

// Sorts and merges `r`, optionally complements it, removes surrogates.
CharSet MakeSet(std::vector<std::pair<uint32_t, uint32_t>> r, bool negate) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& x : r) {
    if (!merged.empty() && x.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, x.second);
    } else {
      merged.push_back(x);
    }
  }
  if (negate) {
    std::vector<std::pair<uint32_t, uint32_t>> c;
    uint32_t next = 0;
    for (const auto& x : merged) {
      if (x.first > next) c.push_back({next, x.first - 1});
      next = x.second + 1;
    }
    if (next <= kMaxCodePoint) c.push_back({next, kMaxCodePoint});
    merged = std::move(c);
  }
  CharSet s;
  for (const auto& x : merged) {
    // Remove D800–DFFF.
    if (x.second < 0xD800 || x.first > 0xDFFF) {
      s.ranges.push_back(x);
    } else {
      if (x.first < 0xD800) s.ranges.push_back({x.first, 0xD7FF});
      if (x.second > 0xDFFF) s.ranges.push_back({0xE000, x.second});
    }
  }
  for (const auto& x : s.ranges) {
    for (uint32_t c = x.first; c <= std::min<uint32_t>(x.second, 127); ++c) {
      s.ascii[c >> 6] |= uint64_t{1} << (c & 63);
    }
  }
  if (!s.ranges.empty()) s.min_bytes = Utf8Len(s.ranges.front().first);
  return s;
}

enum class Kind : uint8_t { kEnd, kRef, kChars };
struct Elem {
  Kind kind;
  int32_t value;  // kRef: rule id; kChars: set id
};

struct CompiledGrammar {
  std::vector<Elem> elems;                     // every alternative, END-terminated
  std::vector<std::vector<int32_t>> rule_alts;  // [rules] start positions
  std::vector<std::string> rule_names;
  std::vector<CharSet> sets;
  std::vector<int32_t> rule_min;    // [rules] fewest bytes (kInf: never ends)
  std::vector<int32_t> suffix_min;  // [elems]
  int32_t root = 0;
};

// ---------------------------------------------------------------------------
// Parsing.

struct PElem {
  Kind kind;
  int32_t value;
};
using Alt = std::vector<PElem>;

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src) {}

  Result<std::unique_ptr<CompiledGrammar>> Run() {
    if (src_.size() > Grammar::kMaxTextBytes) {
      return Error(0, "grammar text above " + std::to_string(Grammar::kMaxTextBytes) + " bytes");
    }
    SkipSpace(true);
    if (pos_ >= src_.size()) return Error(0, "empty grammar");
    while (pos_ < src_.size()) {
      ARBITER_RETURN_IF_ERROR(ParseRule());
      SkipSpace(true);
    }
    for (size_t i = 0; i < names_.size(); ++i) {
      if (!defined_[i]) return Error(ref_pos_[i], "undefined rule \"" + names_[i] + "\"");
    }
    auto it = ids_.find("root");
    if (it == ids_.end() || !defined_[it->second]) return Error(0, "missing rule \"root\"");
    return Compile(it->second);
  }

 private:
  Status Error(size_t at, const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return InvalidArgumentError("grammar: line " + std::to_string(line) + ", column " +
                                std::to_string(col) + ": " + what);
  }

  bool AtEnd() const { return pos_ >= src_.size(); }
  char Peek(size_t k = 0) const { return pos_ + k < src_.size() ? src_[pos_ + k] : '\0'; }
  static bool IsNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }

  void SkipSpace(bool newline_ok) {
    while (!AtEnd()) {
      char c = src_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && src_[pos_] != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  int Symbol(const std::string& name, size_t at) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    int id = static_cast<int>(names_.size());
    ids_.emplace(name, id);
    names_.push_back(name);
    defined_.push_back(false);
    ref_pos_.push_back(at);
    rules_.emplace_back();
    return id;
  }

  Result<int> NewRule(const std::string& base, std::vector<Alt> alts) {
    if (static_cast<int>(names_.size()) >= Grammar::kMaxRules) {
      return Error(pos_, "more than " + std::to_string(Grammar::kMaxRules) + " rules (counting groups and repetitions)");
    }
    // Generated names hold a character user names cannot, so they never clash.
    int id = Symbol(base + "#" + std::to_string(names_.size()), pos_);
    defined_[id] = true;
    for (const Alt& a : alts) n_elems_ += a.size() + 1;
    rules_[id] = std::move(alts);
    if (n_elems_ > static_cast<size_t>(Grammar::kMaxElements)) {
      return Error(pos_, "grammar larger than " + std::to_string(Grammar::kMaxElements) + " elements");
    }
    return id;
  }

  Status ParseRule() {
    size_t start = pos_;
    while (!AtEnd() && IsNameChar(src_[pos_])) ++pos_;
    if (pos_ == start) return Error(pos_, "expected a rule name");
    std::string name(src_.substr(start, pos_ - start));
    SkipSpace(false);
    if (src_.substr(pos_, 3) != "::=") return Error(pos_, "expected \"::=\" after rule name \"" + name + "\"");
    pos_ += 3;
    SkipSpace(true);
    int id = Symbol(name, start);
    if (defined_[id]) return Error(start, "rule \"" + name + "\" defined twice");
    defined_[id] = true;
    ref_pos_[id] = start;
    rule_name_ = name;
    std::vector<Alt> alts;
    ARBITER_RETURN_IF_ERROR(ParseAlternates(0, &alts));
    for (const Alt& a : alts) n_elems_ += a.size() + 1;
    if (n_elems_ > static_cast<size_t>(Grammar::kMaxElements)) {
      return Error(pos_, "grammar larger than " + std::to_string(Grammar::kMaxElements) + " elements");
    }
    rules_[id] = std::move(alts);
    SkipSpace(false);
    if (!AtEnd() && Peek() != '\n' && Peek() != '\r') {
      return Error(pos_, std::string("unexpected \"") + Peek() + "\" in rule \"" + name + "\"");
    }
    return OkStatus();
  }

  Status ParseAlternates(int depth, std::vector<Alt>* alts) {
    while (true) {
      Alt seq;
      ARBITER_RETURN_IF_ERROR(ParseSequence(depth, &seq));
      alts->push_back(std::move(seq));
      if (depth == 0 && (Peek() == '\n' || Peek() == '\r')) {
        // A top-level body may continue on a line that starts with `|`.
        size_t save = pos_;
        SkipSpace(true);
        if (Peek() != '|') pos_ = save;
      }
      if (Peek() != '|') return OkStatus();
      ++pos_;
      SkipSpace(true);
    }
  }

  Status ParseSequence(int depth, Alt* seq) {
    while (true) {
      SkipSpace(depth > 0);
      if (AtEnd()) return OkStatus();
      const size_t at = pos_;
      const char c = Peek();
      Alt item;
      if (c == '"') {
        ++pos_;
        while (true) {
          if (AtEnd() || Peek() == '\n') return Error(at, "unterminated string literal");
          if (Peek() == '"') {
            ++pos_;
            break;
          }
          ARBITER_ASSIGN_OR_RETURN(uint32_t cp, ParseChar(false));
          item.push_back({Kind::kChars, AddSet(MakeSet({{cp, cp}}, false))});
        }
      } else if (c == '[') {
        ++pos_;
        bool negate = false;
        if (Peek() == '^') {
          negate = true;
          ++pos_;
        }
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        while (true) {
          if (AtEnd()) return Error(at, "unterminated character class");
          if (Peek() == ']') {
            ++pos_;
            break;
          }
          ARBITER_ASSIGN_OR_RETURN(uint32_t lo, ParseChar(true));
          uint32_t hi = lo;
          if (Peek() == '-' && Peek(1) != ']' && Peek(1) != '\0') {
            ++pos_;
            const size_t hi_at = pos_;
            ARBITER_ASSIGN_OR_RETURN(hi, ParseChar(true));
            if (hi < lo) return Error(hi_at, "character range out of order");
          }
          ranges.push_back({lo, hi});
        }
        item.push_back({Kind::kChars, AddSet(MakeSet(std::move(ranges), negate))});
      } else if (c == '.') {
        ++pos_;
        item.push_back({Kind::kChars, AddSet(MakeSet({{0, kMaxCodePoint}}, false))});
      } else if (c == '(') {
        if (depth + 1 > Grammar::kMaxNesting) {
          return Error(at, "parentheses nested deeper than " + std::to_string(Grammar::kMaxNesting));
        }
        ++pos_;
        SkipSpace(true);
        std::vector<Alt> alts;
        ARBITER_RETURN_IF_ERROR(ParseAlternates(depth + 1, &alts));
        SkipSpace(true);
        if (Peek() != ')') return Error(at, "unclosed \"(\"");
        ++pos_;
        ARBITER_ASSIGN_OR_RETURN(int id, NewRule(rule_name_, std::move(alts)));
        item.push_back({Kind::kRef, id});
      } else if (IsNameChar(c)) {
        size_t start = pos_;
        while (!AtEnd() && IsNameChar(src_[pos_])) ++pos_;
        std::string name(src_.substr(start, pos_ - start));
        size_t after = pos_;
        while (after < src_.size() && (src_[after] == ' ' || src_[after] == '\t')) ++after;
        if (src_.substr(after, 3) == "::=") {
          return Error(start, "expected end of line before rule \"" + name + "\"");
        }
        if (static_cast<int>(names_.size()) >= Grammar::kMaxRules) {
          return Error(start, "more than " + std::to_string(Grammar::kMaxRules) + " rules");
        }
        item.push_back({Kind::kRef, Symbol(name, start)});
      } else {
        return OkStatus();  // ')' '|' newline or something the caller reports
      }
      SkipSpace(depth > 0);
      ARBITER_RETURN_IF_ERROR(ParsePostfix(std::move(item), seq));
      if (n_elems_ + seq->size() > static_cast<size_t>(Grammar::kMaxElements)) {
        return Error(at, "grammar larger than " + std::to_string(Grammar::kMaxElements) + " elements");
      }
    }
  }

  Result<int> ParseCount() {
    const size_t at = pos_;
    int64_t v = 0;
    if (!(Peek() >= '0' && Peek() <= '9')) return Error(at, "expected a number in \"{}\"");
    while (Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      ++pos_;
      if (v > Grammar::kMaxRepetition) {
        return Error(at, "repetition count above " + std::to_string(Grammar::kMaxRepetition));
      }
    }
    return static_cast<int>(v);
  }

  Status ParsePostfix(Alt item, Alt* seq) {
    const char c = Peek();
    if (c != '*' && c != '+' && c != '?' && c != '{') {
      seq->insert(seq->end(), item.begin(), item.end());
      return OkStatus();
    }
    const size_t at = pos_;
    int min = 0, max = -1;  // -1: unbounded
    if (c == '*') {
      ++pos_;
    } else if (c == '+') {
      ++pos_;
      min = 1;
    } else if (c == '?') {
      ++pos_;
      max = 1;
    } else {
      ++pos_;
      SkipSpace(false);
      ARBITER_ASSIGN_OR_RETURN(min, ParseCount());
      SkipSpace(false);
      if (Peek() == ',') {
        ++pos_;
        SkipSpace(false);
        if (Peek() != '}') {
          ARBITER_ASSIGN_OR_RETURN(max, ParseCount());
          if (max < min) return Error(at, "repetition {m,n} with n < m");
        }
      } else {
        max = min;
      }
      SkipSpace(false);
      if (Peek() != '}') return Error(at, "unclosed \"{\"");
      ++pos_;
    }
    SkipSpace(false);
    if (item.empty()) return OkStatus();  // ""* is ε
    PElem x = item[0];
    if (item.size() != 1) {
      ARBITER_ASSIGN_OR_RETURN(int id, NewRule(rule_name_, {item}));
      x = {Kind::kRef, id};
    }
    for (int i = 0; i < min; ++i) seq->push_back(x);
    if (n_elems_ + seq->size() > static_cast<size_t>(Grammar::kMaxElements)) {
      return Error(at, "grammar larger than " + std::to_string(Grammar::kMaxElements) + " elements");
    }
    if (max < 0) {
      int id = Symbol(rule_name_ + "#" + std::to_string(names_.size()), pos_);
      defined_[id] = true;
      rules_[id] = {{x, {Kind::kRef, id}}, {}};
      n_elems_ += 5;
      seq->push_back({Kind::kRef, id});
    } else if (max > min) {
      int inner = -1;
      for (int k = 0; k < max - min; ++k) {
        Alt a = {x};
        if (inner >= 0) a.push_back({Kind::kRef, inner});
        ARBITER_ASSIGN_OR_RETURN(inner, NewRule(rule_name_, {a, {}}));
      }
      seq->push_back({Kind::kRef, inner});
    }
    return OkStatus();
  }

  // One character of a literal or class: an escape or a UTF-8 sequence.
  Result<uint32_t> ParseChar(bool in_class) {
    const size_t at = pos_;
    unsigned char c = static_cast<unsigned char>(src_[pos_]);
    if (c == '\\') {
      ++pos_;
      if (AtEnd()) return Error(at, "bad escape at end of input");
      char e = src_[pos_++];
      switch (e) {
        case 'n': return uint32_t{'\n'};
        case 'r': return uint32_t{'\r'};
        case 't': return uint32_t{'\t'};
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/':
          return static_cast<uint32_t>(e);
        case 'x': return ParseHex(at, 2);
        case 'u': return ParseHex(at, 4);
        case 'U': return ParseHex(at, 8);
        default:
          return Error(at, std::string("bad escape \"\\") + e + "\"");
      }
    }
    if (!in_class && c == '\n') return Error(at, "unterminated string literal");
    if (c < 0x80) {
      ++pos_;
      return uint32_t{c};
    }
    int len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
    if (len == 0 || pos_ + len > src_.size()) return Error(at, "invalid UTF-8");
    uint32_t cp = c & (0xFF >> (len + 1));
    for (int i = 1; i < len; ++i) {
      unsigned char d = static_cast<unsigned char>(src_[pos_ + i]);
      if ((d & 0xC0) != 0x80) return Error(at, "invalid UTF-8");
      cp = cp << 6 | (d & 0x3F);
    }
    if (Utf8Len(cp) != len || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return Error(at, "invalid UTF-8");
    }
    pos_ += len;
    return cp;
  }

  Result<uint32_t> ParseHex(size_t at, int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      char h = Peek();
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) return Error(at, "bad escape: expected " + std::to_string(digits) + " hex digits");
      v = v * 16 + d;
      ++pos_;
    }
    if (v > kMaxCodePoint) return Error(at, "bad escape: code point above U+10FFFF");
    return v;
  }

  int AddSet(CharSet s) {
    sets_.push_back(std::move(s));
    return static_cast<int>(sets_.size()) - 1;
  }

  Result<std::unique_ptr<CompiledGrammar>> Compile(int root) {
    auto g = std::make_unique<CompiledGrammar>();
    const int n = static_cast<int>(rules_.size());
    g->root = root;
    g->rule_names = names_;
    g->sets = std::move(sets_);
    g->rule_alts.resize(n);
    for (int r = 0; r < n; ++r) {
      for (const Alt& a : rules_[r]) {
        g->rule_alts[r].push_back(static_cast<int32_t>(g->elems.size()));
        for (const PElem& e : a) g->elems.push_back({e.kind, e.value});
        g->elems.push_back({Kind::kEnd, 0});
      }
    }
    ComputeMinLengths(g.get());
    // Every rule reachable from root must be able to end.
    std::vector<char> seen(n, 0);
    std::vector<int> todo = {root};
    seen[root] = 1;
    while (!todo.empty()) {
      int r = todo.back();
      todo.pop_back();
      if (g->rule_min[r] >= kInf) return Error(ref_pos_[r], "rule \"" + UserName(r) + "\" can never end");
      for (const Alt& a : rules_[r]) {
        for (const PElem& e : a) {
          if (e.kind == Kind::kRef && !seen[e.value]) {
            seen[e.value] = 1;
            todo.push_back(e.value);
          }
        }
      }
    }
    ARBITER_RETURN_IF_ERROR(CheckLeftRecursion(*g));
    return g;
  }

  std::string UserName(int r) const {
    const std::string& s = names_[r];
    return s.substr(0, s.find('#'));
  }

  void ComputeMinLengths(CompiledGrammar* g) {
    const int n = static_cast<int>(rules_.size());
    g->rule_min.assign(n, kInf);
    // Per alternative: refs still unresolved and the cost so far.
    struct AltState {
      int rule;
      int pending;
      int64_t cost;
    };
    std::vector<AltState> alts;
    std::vector<std::vector<int>> users(n);  // rule → alternatives referring to it (per occurrence)
    using Item = std::pair<int64_t, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
    for (int r = 0; r < n; ++r) {
      for (const Alt& a : rules_[r]) {
        AltState s{r, 0, 0};
        const int idx = static_cast<int>(alts.size());
        for (const PElem& e : a) {
          if (e.kind == Kind::kChars) {
            s.cost += g->sets[e.value].min_bytes;
          } else {
            ++s.pending;
            users[e.value].push_back(idx);
          }
        }
        alts.push_back(s);
        if (s.pending == 0 && s.cost < kInf) heap.push({s.cost, r});
      }
    }
    std::vector<char> done(n, 0);
    while (!heap.empty()) {
      auto [cost, r] = heap.top();
      heap.pop();
      if (done[r]) continue;
      done[r] = 1;
      g->rule_min[r] = static_cast<int32_t>(cost);
      for (int idx : users[r]) {
        AltState& s = alts[idx];
        s.cost += cost;
        if (--s.pending == 0 && s.cost < kInf && !done[s.rule]) heap.push({s.cost, s.rule});
      }
    }
    g->suffix_min.assign(g->elems.size(), 0);
    for (size_t i = g->elems.size(); i-- > 0;) {
      const Elem& e = g->elems[i];
      if (e.kind == Kind::kEnd) {
        g->suffix_min[i] = 0;
        continue;
      }
      int64_t c = e.kind == Kind::kChars ? g->sets[e.value].min_bytes : g->rule_min[e.value];
      g->suffix_min[i] = static_cast<int32_t>(std::min<int64_t>(kInf, c + g->suffix_min[i + 1]));
    }
  }

  Status CheckLeftRecursion(const CompiledGrammar& g) {
    const int n = static_cast<int>(rules_.size());
    // Edge r → s when s can be the first thing r expands to.
    std::vector<std::vector<int>> first(n);
    for (int r = 0; r < n; ++r) {
      for (const Alt& a : rules_[r]) {
        for (const PElem& e : a) {
          if (e.kind == Kind::kChars) break;
          first[r].push_back(e.value);
          if (g.rule_min[e.value] != 0) break;
        }
      }
    }
    std::vector<char> color(n, 0);  // 0 new, 1 on path, 2 done
    for (int s = 0; s < n; ++s) {
      if (color[s]) continue;
      std::vector<std::pair<int, size_t>> path = {{s, 0}};
      color[s] = 1;
      while (!path.empty()) {
        auto& [r, i] = path.back();
        if (i == first[r].size()) {
          color[r] = 2;
          path.pop_back();
          continue;
        }
        int t = first[r][i++];
        if (color[t] == 1) return Error(ref_pos_[t], "left recursion through rule \"" + UserName(t) + "\"");
        if (color[t] == 0) {
          color[t] = 1;
          path.push_back({t, 0});
        }
      }
    }
    return OkStatus();
  }

  std::string_view src_;
  size_t pos_ = 0;
  std::string rule_name_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, int> ids_;
  std::vector<bool> defined_;
  std::vector<size_t> ref_pos_;  // definition, else first reference
  std::vector<std::vector<Alt>> rules_;
  std::vector<CharSet> sets_;
  size_t n_elems_ = 0;
};

// ---------------------------------------------------------------------------
// Matching (Note [Grammar matching]).

struct State {
  std::vector<int32_t> data;           // the stacks, concatenated, bottom first
  std::vector<uint32_t> off = {0};     // [n + 1] stack i is data[off[i], off[i+1])
  std::vector<int32_t> total;          // [n] fewest bytes completing stack i
  std::vector<uint64_t> hash;          // [n]
  uint32_t cp = 0;                     // partial code point's bits so far
  int8_t need = 0;                     // continuation bytes still needed
  int8_t len = 0;                      // the partial sequence's full length

  int n() const { return static_cast<int>(total.size()); }
  void Clear() {
    data.clear();
    off.assign(1, 0);
    total.clear();
    hash.clear();
    cp = 0;
    need = 0;
    len = 0;
  }
  void CopyFrom(const State& o) {
    data.assign(o.data.begin(), o.data.end());
    off.assign(o.off.begin(), o.off.end());
    total.assign(o.total.begin(), o.total.end());
    hash.assign(o.hash.begin(), o.hash.end());
    cp = o.cp;
    need = o.need;
    len = o.len;
  }
  int32_t Top(int i) const { return off[i + 1] > off[i] ? data[off[i + 1] - 1] : -1; }
};

struct Viable {
  int32_t id;
  int32_t min_to_end;
};

uint32_t MinCodePoint(int len) { return len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000; }

struct Matcher {
  explicit Matcher(const CompiledGrammar& g) : g(g) {}

  const CompiledGrammar& g;
  State cur;
  // Note [Transition cache]: the distinct states FillAllowed has met, each
  // with its byte transitions, kept across calls (up to kMaxCachedStates).
  std::deque<State> states;
  std::deque<std::array<int32_t, 256>> next;  // [states] next state id; kUnknown, kDead
  std::vector<int32_t> state_min;             // [states] MinToEnd
  std::unordered_multimap<uint64_t, int32_t> by_hash;
  State scratch;
  std::vector<int32_t> work;        // Expand's pending stacks, concatenated
  std::vector<uint32_t> work_off;
  std::vector<int32_t> work_total;
  std::vector<int32_t> stack;

  void Add(State* out, int32_t total) {
    if (total >= kInf || out->n() >= kMaxStacks) return;
    uint64_t h = 1469598103934665603ull;
    for (int32_t p : stack) h = (h ^ static_cast<uint32_t>(p)) * 1099511628211ull;
    for (int i = 0; i < out->n(); ++i) {
      if (out->hash[i] == h && out->off[i + 1] - out->off[i] == stack.size() &&
          std::equal(stack.begin(), stack.end(), out->data.begin() + out->off[i])) {
        return;
      }
    }
    out->data.insert(out->data.end(), stack.begin(), stack.end());
    out->off.push_back(static_cast<uint32_t>(out->data.size()));
    out->total.push_back(total);
    out->hash.push_back(h);
  }

  // Expands `stack` (whose completion costs `total`) until every resulting
  // stack's top is a character set, adding them to `out`.
  void Expand(int32_t total, State* out) {
    work.clear();
    work_off.assign(1, 0);
    work_total.clear();
    int budget = kMaxExpansion;
    while (true) {
      bool next = false;
      while (!next) {
        if (stack.empty()) {
          Add(out, total);
          break;
        }
        const int32_t p = stack.back();
        const Elem& e = g.elems[p];
        if (e.kind == Kind::kEnd) {
          stack.pop_back();
          continue;
        }
        if (e.kind == Kind::kChars) {
          Add(out, total);
          break;
        }
        stack.pop_back();
        total -= g.suffix_min[p];
        if (g.elems[p + 1].kind != Kind::kEnd) {
          stack.push_back(p + 1);
          total += g.suffix_min[p + 1];
        }
        if (static_cast<int>(stack.size()) >= kMaxStackDepth) break;
        const std::vector<int32_t>& alts = g.rule_alts[e.value];
        for (size_t k = alts.size(); k-- > 1;) {
          if (--budget < 0) break;
          work.insert(work.end(), stack.begin(), stack.end());
          work.push_back(alts[k]);
          work_off.push_back(static_cast<uint32_t>(work.size()));
          work_total.push_back(total + g.suffix_min[alts[k]]);
        }
        stack.push_back(alts[0]);
        total += g.suffix_min[alts[0]];
      }
      if (work_total.empty()) return;
      const uint32_t b = work_off[work_off.size() - 2];
      stack.assign(work.begin() + b, work.end());
      total = work_total.back();
      work.resize(b);
      work_off.pop_back();
      work_total.pop_back();
    }
  }

  void Init() {
    cur.Clear();
    for (int32_t a : g.rule_alts[g.root]) {
      stack.assign(1, a);
      Expand(g.suffix_min[a], &cur);
    }
  }

  // out = in advanced by code point `cp` (in's partial state ignored).
  void AdvanceCp(const State& in, uint32_t cp, State* out) {
    out->Clear();
    for (int i = 0; i < in.n(); ++i) {
      const int32_t top = in.Top(i);
      if (top < 0 || !g.sets[g.elems[top].value].Match(cp)) continue;
      stack.assign(in.data.begin() + in.off[i], in.data.begin() + in.off[i + 1] - 1);
      int32_t total = in.total[i] - g.suffix_min[top];
      if (g.elems[top + 1].kind != Kind::kEnd) {
        stack.push_back(top + 1);
        total += g.suffix_min[top + 1];
      }
      Expand(total, out);
    }
  }

  // Range of code points a partial sequence can still become; lo > hi: none.
  static std::pair<uint32_t, uint32_t> PartialRange(const State& s) {
    const int shift = 6 * s.need;
    uint32_t lo = s.cp << shift, hi = lo | ((1u << shift) - 1);
    lo = std::max(lo, MinCodePoint(s.len));
    hi = std::min(hi, kMaxCodePoint);
    return {lo, hi};
  }

  bool AnyIntersects(const State& s) const {
    auto [lo, hi] = PartialRange(s);
    if (lo > hi) return false;
    for (int i = 0; i < s.n(); ++i) {
      const int32_t top = s.Top(i);
      if (top >= 0 && g.sets[g.elems[top].value].Intersects(lo, hi)) return true;
    }
    return false;
  }

  // out = in advanced by one byte; false when no stack survives.
  bool AdvanceByte(const State& in, uint8_t b, State* out) {
    if (in.need == 0) {
      if (b < 0x80) {
        AdvanceCp(in, b, out);
        return out->n() > 0;
      }
      const int len = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
      if (len == 0) return false;
      out->CopyFrom(in);
      out->cp = b & (0xFF >> (len + 1));
      out->need = static_cast<int8_t>(len - 1);
      out->len = static_cast<int8_t>(len);
      return AnyIntersects(*out);
    }
    if ((b & 0xC0) != 0x80) return false;
    const uint32_t cp = in.cp << 6 | (b & 0x3F);
    if (in.need == 1) {
      if (cp < MinCodePoint(in.len) || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
      AdvanceCp(in, cp, out);
      return out->n() > 0;
    }
    out->CopyFrom(in);
    out->cp = cp;
    out->need = static_cast<int8_t>(in.need - 1);
    return AnyIntersects(*out);
  }

  int MinToEnd(const State& s) const {
    int best = kInf;
    if (s.need == 0) {
      for (int32_t t : s.total) best = std::min(best, t);
      return best;
    }
    auto [lo, hi] = PartialRange(s);
    for (int i = 0; i < s.n(); ++i) {
      const int32_t top = s.Top(i);
      if (top < 0) continue;
      const CharSet& set = g.sets[g.elems[top].value];
      if (lo <= hi && set.Intersects(lo, hi)) best = std::min(best, s.need + s.total[i] - set.min_bytes);
    }
    return best;
  }

  bool CanEnd(const State& s) const {
    if (s.need != 0) return false;
    for (int i = 0; i < s.n(); ++i) {
      if (s.off[i + 1] == s.off[i]) return true;
    }
    return false;
  }

  static uint64_t Hash(const State& s) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t{s.cp} << 8 | static_cast<uint8_t>(s.need));
    for (uint64_t x : s.hash) h = (h ^ x) * 1099511628211ull;
    return h;
  }
  static bool Same(const State& a, const State& b) {
    return a.cp == b.cp && a.need == b.need && a.len == b.len && a.off == b.off && a.data == b.data;
  }

  static constexpr int32_t kUnknown = -2;
  static constexpr int32_t kDead = -1;
  static constexpr size_t kMaxCachedStates = 1024;

  // The id of a state equal to `s` (stored on first sight).
  int32_t Intern(const State& s) {
    const uint64_t h = Hash(s);
    auto [lo, hi] = by_hash.equal_range(h);
    for (auto it = lo; it != hi; ++it) {
      if (Same(states[it->second], s)) return it->second;
    }
    const int32_t id = static_cast<int32_t>(states.size());
    states.emplace_back().CopyFrom(s);
    next.emplace_back().fill(kUnknown);
    state_min.push_back(MinToEnd(s));
    by_hash.emplace(h, id);
    return id;
  }

  int32_t Next(int32_t id, uint8_t b) {
    int32_t n = next[id][b];
    if (n != kUnknown) return n;
    n = AdvanceByte(states[id], b, &scratch) ? Intern(scratch) : kDead;
    next[id][b] = n;
    return n;
  }

  void ResetCacheIfFull() {
    if (states.size() < kMaxCachedStates) return;
    states.clear();
    next.clear();
    state_min.clear();
    by_hash.clear();
    masks.clear();
  }

  // Note [Mask cache]: the viable tokens of the last few start states.
  struct CachedMask {
    int32_t state = -1;
    uint64_t used = 0;                  // a use counter, for LRU
    int32_t best = 0;                   // min over viable of min_to_end
    std::vector<Viable> viable;         // every viable token and its MinToEnd
  };
  static constexpr size_t kMaxCachedMasks = 4;
  std::vector<CachedMask> masks;
  uint64_t mask_uses = 0;

  // Advances `s` by `bytes`; false (s unspecified) when the grammar refuses.
  bool AdvanceBytes(State* s, std::string_view bytes) {
    State tmp;
    for (unsigned char b : bytes) {
      if (!AdvanceByte(*s, b, &tmp)) return false;
      std::swap(*s, tmp);
    }
    return true;
  }
};

struct Trie {
  struct Node {
    uint32_t child_begin = 0, child_end = 0;  // into child_byte / child_node
    uint32_t tok_begin = 0, tok_end = 0;      // into tokens
  };
  std::vector<Node> nodes = {Node{}};  // [0] is the root
  std::vector<uint8_t> child_byte;
  std::vector<uint32_t> child_node;
  std::vector<int32_t> tokens;
  std::vector<std::string> bytes;  // [vocab] empty for special / too long
  int vocab = 0;
  int max_depth = 0;
};

}  // namespace grammar_internal

using grammar_internal::CompiledGrammar;
using grammar_internal::Matcher;
using grammar_internal::State;
using grammar_internal::Trie;
using grammar_internal::Viable;

Grammar::Grammar(std::unique_ptr<CompiledGrammar> c) : compiled_(std::move(c)) {}
Grammar::~Grammar() = default;

Result<std::shared_ptr<const Grammar>> Grammar::Parse(std::string_view gbnf) {
  grammar_internal::Parser p(gbnf);
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<CompiledGrammar> c, p.Run());
  return std::shared_ptr<const Grammar>(std::make_shared<Grammar>(std::move(c)));
}

int Grammar::MinBytes() const { return compiled_->rule_min[compiled_->root]; }

bool Grammar::Matches(std::string_view text) const {
  Matcher m(*compiled_);
  m.Init();
  return m.AdvanceBytes(&m.cur, text) && m.CanEnd(m.cur);
}

bool Grammar::MatchesPrefix(std::string_view text) const {
  Matcher m(*compiled_);
  m.Init();
  return m.AdvanceBytes(&m.cur, text);
}

GrammarVocabulary::GrammarVocabulary() : trie_(std::make_unique<Trie>()) {}
GrammarVocabulary::~GrammarVocabulary() = default;

int GrammarVocabulary::size() const { return trie_->vocab; }

size_t GrammarVocabulary::bytes() const {
  const Trie& t = *trie_;
  size_t n = sizeof(Trie) + t.nodes.capacity() * sizeof(Trie::Node) + t.child_byte.capacity() +
             t.child_node.capacity() * sizeof(uint32_t) + t.tokens.capacity() * sizeof(int32_t) +
             t.bytes.capacity() * sizeof(std::string);
  for (const std::string& b : t.bytes) {
    if (b.capacity() > 15) n += b.capacity() + 1;  // beyond the small-string buffer
  }
  return n;
}

const std::string& GrammarVocabulary::TokenBytes(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < trie_->vocab ? trie_->bytes[id] : kEmpty;
}

std::shared_ptr<const GrammarVocabulary> GrammarVocabulary::Build(const Tokenizer& tokenizer) {
  auto v = std::make_shared<GrammarVocabulary>();
  Trie& t = *v->trie_;
  t.vocab = tokenizer.vocab_size();
  t.bytes.resize(t.vocab);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < t.vocab; ++id) {
    if (tokenizer.IsSpecial(id)) continue;
    std::string b = tokenizer.TokenBytes(id);
    if (b.empty() || b.size() > grammar_internal::kMaxTokenBytes) continue;
    t.bytes[id] = std::move(b);
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return t.bytes[a] != t.bytes[b] ? t.bytes[a] < t.bytes[b] : a < b;
  });
  // Breadth-first over sorted ranges: a node is a range [lo, hi) of `ids`
  // sharing `depth` leading bytes; its tokens are those exactly `depth` long
  // (first in sorted order), its children the runs of equal next bytes.
  struct Pending {
    uint32_t node, lo, hi, depth;
  };
  std::vector<Pending> queue = {{0, 0, static_cast<uint32_t>(ids.size()), 0}};
  for (size_t q = 0; q < queue.size(); ++q) {
    Pending p = queue[q];
    uint32_t i = p.lo;
    t.nodes[p.node].tok_begin = static_cast<uint32_t>(t.tokens.size());
    while (i < p.hi && t.bytes[ids[i]].size() == p.depth) t.tokens.push_back(ids[i++]);
    t.nodes[p.node].tok_end = static_cast<uint32_t>(t.tokens.size());
    t.nodes[p.node].child_begin = static_cast<uint32_t>(t.child_byte.size());
    while (i < p.hi) {
      const uint8_t b = static_cast<uint8_t>(t.bytes[ids[i]][p.depth]);
      uint32_t j = i;
      while (j < p.hi && static_cast<uint8_t>(t.bytes[ids[j]][p.depth]) == b) ++j;
      const uint32_t child = static_cast<uint32_t>(t.nodes.size());
      t.nodes.emplace_back();
      t.child_byte.push_back(b);
      t.child_node.push_back(child);
      queue.push_back({child, i, j, p.depth + 1});
      t.max_depth = std::max<int>(t.max_depth, p.depth + 1);
      i = j;
    }
    t.nodes[p.node].child_end = static_cast<uint32_t>(t.child_byte.size());
  }
  return v;
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar,
                                     std::shared_ptr<const GrammarVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)),
      m_(std::make_unique<Matcher>(grammar_->compiled())) {
  m_->Init();
}

GrammarConstraint::~GrammarConstraint() = default;

namespace {

void Walk(Matcher& m, const Trie& t, uint32_t node, int32_t state, std::vector<Viable>* out) {
  const Trie::Node& n = t.nodes[node];
  for (uint32_t c = n.child_begin; c < n.child_end; ++c) {
    const int32_t nx = m.Next(state, t.child_byte[c]);
    if (nx < 0) continue;
    const Trie::Node& child = t.nodes[t.child_node[c]];
    if (child.tok_end > child.tok_begin) {
      const int32_t min_to_end = m.state_min[nx];
      for (uint32_t k = child.tok_begin; k < child.tok_end; ++k) out->push_back({t.tokens[k], min_to_end});
    }
    if (child.child_end > child.child_begin) Walk(m, t, t.child_node[c], nx, out);
  }
}

}  // namespace

void GrammarConstraint::FillAllowed(int tokens_left, std::span<uint8_t> allowed) {
  Matcher& m = *m_;
  m.ResetCacheIfFull();
  const int32_t state = m.Intern(m.cur);
  Matcher::CachedMask* mask = nullptr;
  for (Matcher::CachedMask& c : m.masks) {
    if (c.state == state) mask = &c;
  }
  if (mask == nullptr) {
    if (m.masks.size() < Matcher::kMaxCachedMasks) {
      mask = &m.masks.emplace_back();
    } else {
      mask = &*std::min_element(m.masks.begin(), m.masks.end(),
                                [](const auto& a, const auto& b) { return a.used < b.used; });
    }
    mask->state = state;
    mask->viable.clear();
    Walk(m, vocab_->trie(), 0, state, &mask->viable);
    mask->best = grammar_internal::kInf;
    for (const Viable& v : mask->viable) mask->best = std::min(mask->best, v.min_to_end);
  }
  mask->used = ++m.mask_uses;
  // Note [Length-aware masking].
  const int budget = std::max(tokens_left, 1) - 1;
  // No token fits the budget: when the output is complete, ending it is the
  // closing path (the engine offers end-of-sequence), so nothing else is
  // allowed; otherwise the budget is already too small (or the vocabulary
  // cannot spell the closing bytes) and the shortest viable tokens are the
  // best effort.
  if (mask->best > budget && m.CanEnd(m.cur)) return;
  const int limit = std::max(budget, mask->best);
  for (const Viable& v : mask->viable) {
    if (v.min_to_end <= limit && static_cast<size_t>(v.id) < allowed.size()) allowed[v.id] = 1;
  }
}

Status GrammarConstraint::AcceptBytes(std::string_view bytes) {
  State next;
  next.CopyFrom(m_->cur);
  if (!m_->AdvanceBytes(&next, bytes)) {
    return InvalidArgumentError("grammar: the output may not continue with these bytes here");
  }
  std::swap(m_->cur, next);
  return OkStatus();
}

Status GrammarConstraint::Accept(int32_t token) {
  if (token < 0 || token >= vocab_->size()) {
    return InvalidArgumentError("grammar: token id " + std::to_string(token) + " is outside the vocabulary");
  }
  const std::string& b = vocab_->TokenBytes(token);
  if (b.empty()) return InvalidArgumentError("grammar: token " + std::to_string(token) + " is special or empty");
  Status s = AcceptBytes(b);
  if (!s.ok()) return InvalidArgumentError("grammar: token " + std::to_string(token) + " is not allowed here");
  return OkStatus();
}

bool GrammarConstraint::CanEnd() const { return m_->CanEnd(m_->cur); }

bool GrammarConstraint::MustEnd() const { return m_->CanEnd(m_->cur) && m_->cur.n() == 1; }

int GrammarConstraint::MinCharsToEnd() const { return m_->MinToEnd(m_->cur); }

}  // namespace arbiter
