#include <gtest/gtest.h>

#include "batchtune/common/error.h"
#include "batchtune/common/shape.h"

using batchtune::parse_shape;

TEST(Shape, ParsesDimensions) {
  EXPECT_EQ(parse_shape("3x64x64"), (std::vector<int64_t>{3, 64, 64}));
  EXPECT_EQ(parse_shape("784"), (std::vector<int64_t>{784}));
  EXPECT_EQ(parse_shape("1X28X28"), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(batchtune::format_shape({3, 224, 224}), "3x224x224");
}

TEST(Shape, RejectsMalformedShapesNamingTheFlag) {
  for (const char* bad : {"", "x", "3x", "x3", "3xx3", "3x0x3", "3x-1", "3*64", "3 x 64",
                          "99999999999999x99999999", "1x1x1x1x1x1x99999999999"}) {
    try {
      parse_shape(bad, "--input");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const batchtune::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--input"), std::string::npos) << e.what();
    }
  }
}
