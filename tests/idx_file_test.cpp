#include "batchtune/data/idx_file.h"

#include <gtest/gtest.h>

#include <string>

#include "batchtune/common/error.h"

namespace batchtune {
namespace {

std::string u32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string error_of(const std::string& bytes) {
  try {
    parse_idx(bytes, "file.idx");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(IdxFile, ReadsTheDimensionsAndBytes) {
  const at::Tensor t = parse_idx(u32(0x0803) + u32(2) + u32(1) + u32(3) + "abcdef", "f");
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(t.scalar_type(), at::kByte);
  EXPECT_EQ(t[1][0][2].item<int64_t>(), 'f');
}

TEST(IdxFile, MalformedFilesNameTheFileAndTheFault) {
  EXPECT_NE(error_of("").find("file.idx: truncated"), std::string::npos);
  EXPECT_NE(error_of(u32(0x0D03)).find("not an IDX file of unsigned bytes"), std::string::npos);
  EXPECT_NE(error_of(u32(0x0800)).find("0 dimensions"), std::string::npos);
  EXPECT_NE(error_of(u32(0x0809)).find("9 dimensions"), std::string::npos);
  EXPECT_NE(error_of(u32(0x0802) + u32(2)).find("the header needs 12 bytes"), std::string::npos);
  EXPECT_NE(error_of(u32(0x0801) + u32(4) + "abc").find("truncated"), std::string::npos);
  EXPECT_NE(error_of(u32(0x0801) + u32(2) + "abc").find("trailing bytes"), std::string::npos);
  // Dimensions whose product overflows are caught, not wrapped; so are
  // huge ones beside a zero (found by fuzz/corpus/idx_reader).
  EXPECT_NE(error_of(u32(0x0804) + u32(~0U) + u32(~0U) + u32(~0U) + u32(~0U) + "x")
                .find("too large"),
            std::string::npos);
  EXPECT_NE(error_of(u32(0x0803) + u32(0) + u32(~0U) + u32(~0U)).find("too large"),
            std::string::npos);
}

}  // namespace
}  // namespace batchtune
