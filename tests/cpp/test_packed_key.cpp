// Unit test of csrc/common/packed_key.h (DESIGN.md, "The packed key").
// Built and run by tests/test_packed_key.py (tests/support/cpp.py):
//   g++ -std=c++17 -O2 -I csrc tests/cpp/test_packed_key.cpp -o test_packed_key
//   ./test_packed_key [seed]
// Prints every failure and exits non-zero if there was one.
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/packed_key.h"

using namespace localargmax;

static int g_failures = 0;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      if (g_failures < 50) {                                          \
        std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
        std::printf(__VA_ARGS__);                                     \
        std::printf("\n");                                            \
      }                                                               \
      ++g_failures;                                                   \
    }                                                                 \
  } while (0)

static float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

static uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// torch.argmax's order: NaN above everything (all NaNs equal), -0 == +0.
static bool argmax_less(float a, float b) {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return a < b;
}

static bool argmax_equal(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b;
}

// decode(encode(x)) must give x bit-exact, except NaN -> canonical NaN and -0 -> +0.
static uint32_t expected_decoded_bits(float x) {
  if (std::isnan(x)) return 0x7FC00000u;
  uint32_t u = to_bits(x);
  return u == 0x80000000u ? 0u : u;
}

static void check_table() {
  struct Row {
    float value;
    uint64_t index;
    uint64_t key;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const Row rows[] = {
      {1.0f, 5, 0xBF800000FFFFFFFAull},
      {-1.0f, 0, 0x407FFFFFFFFFFFFFull},
      {0.0f, 7, 0x80000000FFFFFFF8ull},
      {-0.0f, 7, 0x80000000FFFFFFF8ull},
      {inf, 2, 0xFF800000FFFFFFFDull},
      {-inf, 3, 0x007FFFFFFFFFFFFCull},
      {std::numeric_limits<float>::quiet_NaN(), 9, 0xFFFFFFFFFFFFFFF6ull},
      {-std::numeric_limits<float>::quiet_NaN(), 9, 0xFFFFFFFFFFFFFFF6ull},
      {from_bits(0x7F800001u), 9, 0xFFFFFFFFFFFFFFF6ull},  // signalling NaN
      {from_bits(0xFFFFFFFFu), 9, 0xFFFFFFFFFFFFFFF6ull},  // NaN, all bits set
      {1e-45f, 4, 0x80000001FFFFFFFBull},
      {-2.5f, 100000, 0x3FDFFFFFFFFE795Full},
  };
  for (const Row& r : rows) {
    const uint64_t key = pack_key(r.value, r.index);
    CHECK(key == r.key, "pack_key(bits 0x%08x, %" PRIu64 ") = 0x%016" PRIx64 ", table says 0x%016" PRIx64,
          to_bits(r.value), r.index, key, r.key);
    CHECK(key_index(r.key) == r.index, "key_index(0x%016" PRIx64 ") = %" PRIu64 ", want %" PRIu64, r.key,
          key_index(r.key), r.index);
    const uint32_t got = to_bits(key_value(r.key));
    CHECK(got == expected_decoded_bits(r.value), "key_value(0x%016" PRIx64 ") bits 0x%08x, want 0x%08x", r.key,
          got, expected_decoded_bits(r.value));
    // The high half is ordered_bits.
    CHECK(ordered_bits(r.value) == static_cast<uint32_t>(r.key >> 32), "ordered_bits(bits 0x%08x) = 0x%08x",
          to_bits(r.value), ordered_bits(r.value));
  }
  CHECK(kNoEntryKey == 0, "kNoEntryKey must be 0");
  CHECK(kMaxGlobalIndex == 0xFFFFFFFEull, "kMaxGlobalIndex must be 2**32 - 2");
  // The largest index still gives a non-zero key, even for the smallest value.
  CHECK(pack_key(-std::numeric_limits<float>::infinity(), kMaxGlobalIndex) != kNoEntryKey,
        "(-inf, max index) must not encode to the no-entry key");
  CHECK(key_index(pack_key(3.0f, kMaxGlobalIndex)) == kMaxGlobalIndex, "max index round trip");
  CHECK(max_key(0x8000000000000000ull, 0x7FFFFFFFFFFFFFFFull) == 0x8000000000000000ull,
        "max_key must compare unsigned");
}

static std::vector<float> special_values() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {
      0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
      -std::numeric_limits<float>::quiet_NaN(), from_bits(0x7F800001u), from_bits(0xFF800001u),
      from_bits(0x7FFFFFFFu), from_bits(0xFFFFFFFFu),
      from_bits(0x00000001u), from_bits(0x80000001u),  // smallest denormals
      from_bits(0x007FFFFFu), from_bits(0x807FFFFFu),  // largest denormals
      from_bits(0x00800000u), from_bits(0x80800000u),  // smallest normals
      std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest(),
      1e-45f, 2.5f, -2.5f, 3.0f, 1.0000001f, 0.99999994f};
  return v;
}

static float random_float(std::mt19937_64& rng) {
  // Mix: arbitrary bit patterns (covers NaN payloads, denormals, both zeros)
  // and ordinary values close together (so "equal" and "adjacent" occur).
  const uint64_t r = rng();
  switch (r % 4) {
    case 0: return from_bits(static_cast<uint32_t>(rng()));
    case 1: {
      const auto sv = special_values();
      return sv[rng() % sv.size()];
    }
    case 2: return static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.5f;
    default: {
      const uint32_t base = static_cast<uint32_t>(rng()) & 0x807FFFFFu;  // denormals, both signs
      return from_bits(base | ((rng() & 1) ? 0x3F800000u : 0u));
    }
  }
}

static void check_pair(float a, float b, uint64_t ia, uint64_t ib) {
  const uint32_t oa = ordered_bits(a), ob = ordered_bits(b);
  CHECK((oa < ob) == argmax_less(a, b), "ordered_bits order: a=0x%08x b=0x%08x oa=0x%08x ob=0x%08x", to_bits(a),
        to_bits(b), oa, ob);
  CHECK((oa == ob) == argmax_equal(a, b), "ordered_bits equality: a=0x%08x b=0x%08x oa=0x%08x ob=0x%08x",
        to_bits(a), to_bits(b), oa, ob);
  // Key order: larger value, then smaller index.
  const uint64_t ka = pack_key(a, ia), kb = pack_key(b, ib);
  const bool a_wins = argmax_less(b, a) || (argmax_equal(a, b) && ia < ib);
  if (!(argmax_equal(a, b) && ia == ib)) {
    CHECK((ka > kb) == a_wins, "key order: a=0x%08x@%" PRIu64 " b=0x%08x@%" PRIu64, to_bits(a), ia, to_bits(b), ib);
    CHECK((max_key(ka, kb) == ka) == a_wins, "max_key: a=0x%08x@%" PRIu64 " b=0x%08x@%" PRIu64, to_bits(a), ia,
          to_bits(b), ib);
  } else {
    CHECK(ka == kb, "equal entries must give equal keys");
  }
}

static void check_round_trip(float x, uint64_t index) {
  const uint64_t key = pack_key(x, index);
  CHECK(key != kNoEntryKey, "a real entry must never encode to key 0 (x=0x%08x, index=%" PRIu64 ")", to_bits(x),
        index);
  CHECK(key_index(key) == index, "key_index round trip: x=0x%08x index=%" PRIu64 " got %" PRIu64, to_bits(x), index,
        key_index(key));
  const uint32_t got = to_bits(key_value(key));
  CHECK(got == expected_decoded_bits(x), "key_value round trip: x=0x%08x got 0x%08x want 0x%08x", to_bits(x), got,
        expected_decoded_bits(x));
  CHECK(to_bits(unordered_value(ordered_bits(x))) == expected_decoded_bits(x),
        "unordered_value(ordered_bits(x)) for x=0x%08x", to_bits(x));
}

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 12345;
  std::printf("seed %" PRIu64 "\n", seed);
  std::mt19937_64 rng(seed);

  check_table();

  const auto sv = special_values();
  for (float a : sv)
    for (float b : sv) {
      check_pair(a, b, 3, 3);
      check_pair(a, b, 3, 4);
      check_pair(a, b, 7, 2);
    }
  for (float x : sv) {
    check_round_trip(x, 0);
    check_round_trip(x, kMaxGlobalIndex);
    check_round_trip(x, 123456789);
  }
  for (int i = 0; i < 2000000; ++i) {
    const float a = random_float(rng), b = random_float(rng);
    const uint64_t ia = rng() % (kMaxGlobalIndex + 1);
    const uint64_t ib = (rng() & 1) ? ia : rng() % (kMaxGlobalIndex + 1);
    check_pair(a, b, ia, ib);
    check_round_trip(a, ia);
  }
  // Every float32 bit pattern: ordered_bits is monotone on the sorted non-NaN
  // floats and the round trip is exact.
  {
    uint64_t checked = 0;
    for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 0x101) {  // a dense sample of all patterns
      const float x = from_bits(static_cast<uint32_t>(u));
      check_round_trip(x, u % (kMaxGlobalIndex + 1));
      const float y = std::nextafter(x, std::numeric_limits<float>::infinity());
      if (!std::isnan(x) && !(std::isinf(x) && x > 0)) {
        if (x != y) CHECK(ordered_bits(x) < ordered_bits(y), "nextafter not ordered above x=0x%08x", to_bits(x));
      }
      ++checked;
    }
    std::printf("checked %" PRIu64 " bit patterns\n", checked);
  }

  if (g_failures) {
    std::printf("%d failure(s)\n", g_failures);
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
