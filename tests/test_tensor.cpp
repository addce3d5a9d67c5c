// Tensor views: parts of every item along dim 0 (channel slabs of an NCHW batch), and the CPU
// kernels that take them, against the same computation on contiguous copies.
#include <catch2/catch.hpp>

#include <cstring>

#include "epilog/kernels/cpu.h"
#include "epilog/tensor.h"
#include "test_util.h"

using namespace epilog;

namespace {

std::vector<float> values(const Tensor& t) {
  const Tensor c = t.clone();
  return std::vector<float>(c.f32(), c.f32() + c.numel());
}

}  // namespace

TEST_CASE("tensor: part views a run of every item along dim 0", "[tensor]") {
  std::vector<float> v(2 * 3 * 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  const Tensor t = Tensor::from_vector({2, 3, 2}, v);  // items of 6: 0..5 and 6..11

  const Tensor mid = t.part(2, {2, 1, 2});  // channel 1 of each item
  CHECK_FALSE(mid.contiguous());
  CHECK(mid.item_stride() == 6);
  CHECK(mid.shares_storage(t));
  CHECK(values(mid) == std::vector<float>{2, 3, 8, 9});
  CHECK(mid.clone().contiguous());

  const Tensor tail = mid.slice(1, 2);  // one item left: contiguous again
  CHECK(tail.contiguous());
  CHECK(values(tail) == std::vector<float>{8, 9});

  CHECK(t.part(0, {2, 3, 2}).contiguous());  // the whole item
  CHECK(t.slice(0, 1).part(2, {1, 2, 2}).contiguous());
  CHECK(values(t.slice(0, 1).part(2, {1, 2, 2})) == std::vector<float>{2, 3, 4, 5});

  // A part of a part keeps the outer stride.
  const Tensor inner = t.part(2, {2, 2, 2}).part(2, {2, 1, 2});
  CHECK(inner.item_stride() == 6);
  CHECK(values(inner) == std::vector<float>{4, 5, 10, 11});

  // Writes through a part land in the owner's slab only.
  Tensor owner = Tensor::zeros({2, 3, 2});
  Tensor slab = owner.part(4, {2, 1, 2});
  slab.copy_from(Tensor::from_vector({2, 1, 2}, {1, 2, 3, 4}));
  CHECK(values(owner) == std::vector<float>{0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 3, 4});

  CHECK_THROWS(mid.reshape({4}));
  CHECK_THROWS(t.part(4, {2, 2, 2}));  // past the end of an item
  CHECK_THROWS(t.part(0, {1, 3, 2}));  // dim 0 must stay
}

TEST_CASE("cpu kernels: conv, max-pool, add, upsample, concat and split on channel slabs",
          "[tensor][cpu]") {
  // Inputs and outputs as channel slabs of larger batches give the bits the contiguous run does.
  const int64_t n = 3, c = 4, h = 7, w = 6, k = 5;
  const Tensor xb = Tensor::randn({n, c + 3, h, w}, 1);
  const Tensor x = xb.part(2 * h * w, {n, c, h, w});
  const Tensor xc = x.clone();
  const Tensor wt = Tensor::randn({k, c, 3, 3}, 2, 0.3f);
  const Tensor scale = Tensor::randn({k}, 3), shift = Tensor::randn({k}, 4);

  // conv (3x3, padding 1): x strided, y strided
  const ConvShape cs{n, c, h, w, k, 3, 3, h, w, 1, 1, 1, 1, 1, 1, 1};
  ConvShape strided = cs;
  strided.x_stride = x.item_stride(), strided.y_stride = (k + 2) * h * w;
  Tensor yb = Tensor::full({n, k + 2, h, w}, -7.0f);
  Tensor y = yb.part(h * w, {n, k, h, w});
  Tensor yc = Tensor::empty({n, k, h, w});
  cpu::conv2d(strided, x.f32(), wt.f32(), scale.f32(), shift.f32(), Activation::Silu, y.f32());
  cpu::conv2d(cs, xc.f32(), wt.f32(), scale.f32(), shift.f32(), Activation::Silu, yc.f32());
  CHECK(test::bit_equal(y.clone(), yc));
  const std::vector<float> all = values(yb);
  for (int64_t i = 0; i < yb.numel(); ++i) {
    const int64_t ch = i / (h * w) % (k + 2);
    if (ch == 0 || ch == k + 1) REQUIRE(all[size_t(i)] == -7.0f);  // untouched outside the slab
  }

  // max-pool (3x3, padding 1): strided in and out
  const PoolShape ps{n, c, h, w, h, w, 3, 3, 1, 1, 1, 1, 1, 1, false};
  PoolShape pstrided = ps;
  pstrided.x_stride = x.item_stride(), pstrided.y_stride = (c + 1) * h * w;
  Tensor pb = Tensor::zeros({n, c + 1, h, w});
  Tensor p = pb.part(0, {n, c, h, w}), pc = Tensor::empty({n, c, h, w});
  cpu::maxpool2d(pstrided, x.f32(), p.f32());
  cpu::maxpool2d(ps, xc.f32(), pc.f32());
  CHECK(test::bit_equal(p.clone(), pc));

  // add: both operands and the output strided
  Tensor sb = Tensor::zeros({n, c + 2, h, w});
  Tensor s = sb.part(2 * h * w, {n, c, h, w}), sc = Tensor::empty({n, c, h, w});
  cpu::binary(cpu::Binary::Add, x, p, s);
  cpu::binary(cpu::Binary::Add, xc, pc, sc);
  CHECK(test::bit_equal(s.clone(), sc));

  // upsample: strided in and out
  Tensor ub = Tensor::zeros({n, c + 1, 2 * h, 2 * w});
  Tensor u = ub.part(4 * h * w, {n, c, 2 * h, 2 * w}), uc = Tensor::empty({n, c, 2 * h, 2 * w});
  cpu::upsample_nearest(x, 2, 2, u);
  cpu::upsample_nearest(xc, 2, 2, uc);
  CHECK(test::bit_equal(u.clone(), uc));

  // concat of strided parts into a strided slab, and split back out of it
  Tensor cb = Tensor::zeros({n, 2 * c + 1, h, w});
  Tensor cat = cb.part(h * w, {n, 2 * c, h, w}), catc = Tensor::empty({n, 2 * c, h, w});
  cpu::concat({&x, &p}, 1, cat);
  cpu::concat({&xc, &pc}, 1, catc);
  CHECK(test::bit_equal(cat.clone(), catc));
  Tensor a = Tensor::zeros({n, c + 1, h, w}).part(0, {n, c, h, w});
  std::vector<Tensor> parts{a, Tensor::empty({n, c, h, w})};
  cpu::split(cat, 1, parts);
  CHECK(test::bit_equal(parts[0].clone(), xc));
  CHECK(test::bit_equal(parts[1], pc));
}
