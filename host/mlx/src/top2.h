// A row's argmax and runner-up exactly as the host's `argmax_margin` keeps
// them (host/src/sampling): one scan, `if x > top { second = top; top = x }
// else if x > second { second = x }`, so NaN never enters, the first index
// of the largest wins, and `second` is the largest value at any other index.
//
// With equal values that differ in bits (+0 and -0) the scan keeps, for
// `top` and for `second` alike, the element of lowest index among the equal
// ones. `Top2` carries both indices, so scans over disjoint index sets
// (SIMD lanes, a row cut in pieces for several threads) merge into exactly
// what one scan over their union gives, bits included.
#pragma once
#include <climits>
#include <cmath>

namespace specd_mlx {

struct Top2 {
  float top = -INFINITY, second = -INFINITY;
  // The elements holding them; INT_MAX: none (no value above -inf yet).
  int idx = INT_MAX, sidx = INT_MAX;
  bool nan = false;

  // The scan's step; `i` must grow from one call to the next.
  void push(float x, int i) {
    if (x > top) {
      second = top, sidx = idx;
      top = x, idx = i;
    } else if (x > second) {
      second = x, sidx = i;
    } else if (x != x) {
      nan = true;
    }
  }

  // (v, i) comes before (w, j) in the scan's order of preference.
  static bool before(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

  // The answer over both index sets (disjoint; either may be empty).
  void merge(const Top2& o) {
    bool theirs = before(o.top, o.idx, top, idx);
    const Top2& w = theirs ? o : *this;
    const Top2& l = theirs ? *this : o;
    Top2 m;
    m.top = w.top, m.idx = w.idx;
    // The runner-up: the winner's own, or the loser's best.
    if (before(l.top, l.idx, w.second, w.sidx))
      m.second = l.top, m.sidx = l.idx;
    else
      m.second = w.second, m.sidx = w.sidx;
    m.nan = nan || o.nan;
    *this = m;
  }

  // The index the host reports: 0 when no value rose above -inf.
  int argmax() const { return idx == INT_MAX ? 0 : idx; }
};

}  // namespace specd_mlx
