// This build found no libturbojpeg or stb: image files cannot be read.

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "data/image_codec.h"

namespace batchtune {
namespace {

[[noreturn]] void not_built() {
  throw OptionError(Option::kData, "imagefolder",
                    "this batchtune was built without libturbojpeg and stb; install "
                    "libturbojpeg0-dev and libstb-dev (scripts/setup) and rebuild");
}

}  // namespace

bool image_codec_compiled() { return false; }
Image decode_image(const std::string&, const std::vector<uint8_t>&, int) { not_built(); }
std::vector<uint8_t> encode_jpeg(const Image&, int) { not_built(); }
std::vector<uint8_t> encode_png(const Image&) { not_built(); }

}  // namespace batchtune
