// One libFuzzer executable per target in fuzz_targets.h: CMake compiles this
// file once per target with BATCHTUNE_FUZZ_TARGET set to its name.
#include <cstddef>
#include <cstdint>

#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  batchtune::fuzz::BATCHTUNE_FUZZ_TARGET({reinterpret_cast<const char*>(data), size});
  return 0;
}
