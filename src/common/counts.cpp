#include "batchtune/common/counts.h"

namespace batchtune {

std::optional<int64_t> checked_product(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product) || product > kMaxPlanCount) return std::nullopt;
  return product;
}

}  // namespace batchtune
