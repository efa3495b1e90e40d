// ImageFolderDataset: listing, decoding JPEG and PNG, augmentation, bad files.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <tuple>

#include "batchtune/data/image_folder.h"
#include "batchtune/data/loader.h"
#include "batchtune/common/error.h"
#include "image_folder_fixture.h"

namespace {

using batchtune::ImageFolderDataset;
using batchtune::ImageFolderOptions;
using batchtune::testing::ImageFolder;

std::vector<int64_t> all_indices(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

TEST(ImageFolder, ListsClassesAndSamplesInNameOrder) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(3, 8);
  ImageFolderDataset data(folder.dir(), ImageFolderOptions().sample_shape({3, 24, 32}));
  EXPECT_EQ(data.size(), 24);
  EXPECT_EQ(data.classes(), 3);
  EXPECT_EQ(data.class_names(), (std::vector<std::string>{"class0", "class1", "class2"}));
  EXPECT_EQ(data.sample_shape(), (std::vector<int64_t>{3, 24, 32}));
  for (int64_t i = 0; i < data.size(); ++i) {
    EXPECT_EQ(data.path(i), folder.files()[static_cast<size_t>(i)]);
    EXPECT_EQ(data.label(i), i / 8);
  }
  EXPECT_NE(data.describe().find("24 samples, 3x24x32, 3 classes"), std::string::npos)
      << data.describe();
}

TEST(ImageFolder, DecodesJpegAndPngToNormalisedPixelsOfTheClassColour) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(3, 4);
  ImageFolderDataset data(folder.dir(), ImageFolderOptions().sample_shape({3, 16, 16}));
  const batchtune::Batch batch = data.get_batch(all_indices(data.size()));
  ASSERT_EQ(batch.inputs[0].sizes(), (std::vector<int64_t>{12, 3, 16, 16}));
  EXPECT_TRUE(at::isfinite(batch.inputs[0]).all().item<bool>());
  for (int64_t i = 0; i < data.size(); ++i) {
    EXPECT_EQ(batch.target[i].item<int64_t>(), i / 4);
    // The class's channel is bright (180-240 of 255), the others dark (40-100):
    // after (x - mean) / std the bright channel is clearly the largest.
    const at::Tensor means = batch.inputs[0][i].mean({1, 2});
    EXPECT_EQ(means.argmax().item<int64_t>(), i / 4) << data.path(i) << " " << means;
    const double bright = means[i / 4].item<double>();
    const double expected = (210.0 / 255 - batchtune::kImageNetMean[i / 4]) /
                            batchtune::kImageNetStd[i / 4];
    EXPECT_NEAR(bright, expected, 0.35) << data.path(i);  // JPEG loss, bilinear edges
  }
}

TEST(ImageFolder, GrayOutputHasOneChannel) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(2, 2);
  ImageFolderDataset data(folder.dir(), ImageFolderOptions().sample_shape({1, 10, 12}));
  EXPECT_EQ(data.get_batch({0, 3}).inputs[0].sizes(), (std::vector<int64_t>{2, 1, 10, 12}));
}

TEST(ImageFolder, AugmentationDependsOnTheDrawAndIndexOnly) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(2, 6);
  ImageFolderDataset data(folder.dir(), ImageFolderOptions().sample_shape({3, 20, 20}).seed(3));
  const at::Tensor a = data.draw_batch({0, 1, 2, 3}, 7).inputs[0];
  // The same samples in another batch arrangement, same draw: same pixels.
  const at::Tensor b = data.draw_batch({3, 2, 1, 0}, 7).inputs[0];
  EXPECT_TRUE(at::equal(a[0], b[3]));
  EXPECT_TRUE(at::equal(a[3], b[0]));
  // Another draw crops or flips differently for some sample.
  const at::Tensor c = data.draw_batch({0, 1, 2, 3}, 8).inputs[0];
  EXPECT_FALSE(at::equal(a, c));
  // Evaluation batches are not augmented: the same every time.
  EXPECT_TRUE(at::equal(data.get_batch({0, 1}).inputs[0], data.get_batch({0, 1}).inputs[0]));
}

TEST(ImageFolder, DrawsAreDeterministicAndNotAllTheCentreCrop) {
  BATCHTUNE_REQUIRE_IMAGES();
  // Over many draws some sample is cropped off-centre or flipped.
  ImageFolder folder(2, 1);
  ImageFolderDataset data(folder.dir(), ImageFolderOptions().sample_shape({3, 16, 16}));
  int differ = 0;
  for (uint64_t draw = 0; draw < 16; ++draw) {
    const at::Tensor x = data.draw_batch({0}, draw).inputs[0][0];
    const at::Tensor y = data.draw_batch({0}, draw).inputs[0][0];
    EXPECT_TRUE(at::equal(x, y));  // deterministic per draw
    if (!at::equal(x, data.get_batch({0}).inputs[0][0])) ++differ;
  }
  EXPECT_GT(differ, 0);
}

TEST(ImageFolder, CorruptFileIsAnErrorNamingIt) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(2, 4);
  const std::string bad = folder.files()[5];
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << "\x89PNG but not really";
  ImageFolderDataset data(folder.dir(), ImageFolderOptions().sample_shape({3, 16, 16}));
  try {
    data.get_batch(all_indices(data.size()));
    FAIL() << "no error for " << bad;
  } catch (const batchtune::Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

TEST(ImageFolder, TruncatedJpegIsAnErrorNamingIt) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(2, 4);
  const std::string bad = folder.files()[2];  // a .jpg
  std::ifstream in(bad, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  in.close();
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  ImageFolderDataset data(folder.dir(), ImageFolderOptions().sample_shape({3, 16, 16}));
  EXPECT_THROW(data.get_batch({2}), batchtune::Error);
}

TEST(ImageFolder, SkipBadSamplesWarnsCountsAndFillsTheBatch) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(2, 4);
  const std::string bad = folder.files()[1];
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << "not an image";
  ImageFolderDataset data(folder.dir(),
                          ImageFolderOptions().sample_shape({3, 16, 16}).skip_bad_samples(true));
  const batchtune::Batch batch = data.get_batch(all_indices(data.size()));
  EXPECT_EQ(batch.inputs[0].size(0), data.size());
  EXPECT_EQ(data.skipped_samples(), 1);
  EXPECT_EQ(data.skipped_files(), std::vector<std::string>{bad});
  // Its stand-in is the next sample.
  EXPECT_TRUE(at::equal(batch.inputs[0][1], batch.inputs[0][2]));
  data.get_batch({1});
  EXPECT_EQ(data.skipped_samples(), 1);  // counted once per file
}

TEST(ImageFolder, AClassWhoseEveryImageIsUnreadableIsNamed) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(2, 2);
  for (int i : {0, 1}) {  // both files of class0
    std::ofstream(folder.files()[static_cast<size_t>(i)], std::ios::binary | std::ios::trunc)
        << "not an image";
  }
  std::ofstream(folder.files()[2], std::ios::binary | std::ios::trunc) << "not an image";
  ImageFolderDataset data(folder.dir(),
                          ImageFolderOptions().sample_shape({3, 16, 16}).skip_bad_samples(true));
  data.get_batch({0, 1, 2, 3});
  EXPECT_EQ(data.skipped_samples(), 3);
  EXPECT_EQ(data.unreadable_classes(), std::vector<std::string>{"class0"})
      << "class1 kept one readable image";
}

TEST(ImageFolder, CmykJpegsDecodeToTheirColoursNotCorrupt) {
  BATCHTUNE_REQUIRE_IMAGES();
  // Inverted CMYK (as libjpeg-turbo and Adobe write it) of one colour.
  const uint8_t r = 200, g = 40, b = 90;
  const uint8_t k = std::max({r, g, b});  // inverted: 255 − black
  batchtune::Image cmyk{8, 8, 4, {}};
  for (int i = 0; i < 64; ++i) {
    for (uint8_t v : {static_cast<uint8_t>(r * 255 / k), static_cast<uint8_t>(g * 255 / k),
                      static_cast<uint8_t>(b * 255 / k), k}) {
      cmyk.pixels.push_back(v);
    }
  }
  const std::vector<uint8_t> bytes = batchtune::encode_jpeg(cmyk, 100);
  const batchtune::Image rgb = batchtune::decode_image("cmyk.jpg", bytes, 3);
  ASSERT_EQ(rgb.pixels.size(), 8u * 8u * 3u);
  EXPECT_NEAR(rgb.pixels[0], r, 6);
  EXPECT_NEAR(rgb.pixels[1], g, 6);
  EXPECT_NEAR(rgb.pixels[2], b, 6);
  const batchtune::Image grey = batchtune::decode_image("cmyk.jpg", bytes, 1);
  EXPECT_NEAR(grey.pixels[0], (299 * r + 587 * g + 114 * b) / 1000, 6);
}

TEST(ImageFolder, BadFoldersAreErrorsNamingThem) {
  BATCHTUNE_REQUIRE_IMAGES();
  EXPECT_THROW(ImageFolderDataset("/nonexistent/images", ImageFolderOptions()), batchtune::Error);
  ImageFolder one_class(1, 2);
  try {
    ImageFolderDataset data(one_class.dir(), ImageFolderOptions());
    FAIL();
  } catch (const batchtune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 2"), std::string::npos) << e.what();
  }
  ImageFolder folder(2, 2);
  EXPECT_THROW(ImageFolderDataset(folder.dir(), ImageFolderOptions().sample_shape({4, 8, 8})),
               batchtune::Error);
  ::mkdir((folder.dir() + "/empty").c_str(), 0755);
  try {
    ImageFolderDataset data(folder.dir(), ImageFolderOptions());
    FAIL();
  } catch (const batchtune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/empty"), std::string::npos) << e.what();
  }
}

TEST(ImageFolder, OpenDatasetTakesTheShapeFromTheInput) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(3, 2);
  auto splits = batchtune::open_dataset("imagefolder:" + folder.dir(), {3, 12, 12}, 10, 0);
  EXPECT_EQ(splits.train->classes(), 3);
  EXPECT_EQ(splits.train->sample_shape(), (std::vector<int64_t>{3, 12, 12}));
  EXPECT_FALSE(splits.train->synthetic());
  EXPECT_EQ(splits.test, nullptr);
  EXPECT_THROW(batchtune::open_dataset("imagefolder:", {3, 12, 12}, 10, 0), batchtune::Error);
}

}  // namespace

namespace {

/// A real JPEG whose SOF0 header is patched to declare `side`x`side`: 600
/// bytes that would decode to side² × 3 bytes.
std::vector<uint8_t> bomb_jpeg(int side) {
  std::mt19937 rng(3);
  std::vector<uint8_t> bytes = batchtune::encode_jpeg(batchtune::testing::test_image(16, 16, 0, rng));
  for (size_t i = 0; i + 8 < bytes.size(); ++i) {
    if (bytes[i] == 0xFF && (bytes[i + 1] == 0xC0 || bytes[i + 1] == 0xC2)) {
      bytes[i + 5] = bytes[i + 7] = static_cast<uint8_t>(side >> 8);
      bytes[i + 6] = bytes[i + 8] = static_cast<uint8_t>(side & 0xFF);
      return bytes;
    }
  }
  ADD_FAILURE() << "no SOF marker in the encoded JPEG";
  return bytes;
}

TEST(ImageFolderBounds, ABombHeaderIsRefusedBeforeDecodingNamingTheFile) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(2, 4);
  const std::string bomb = folder.files()[0];  // a .jpg
  batchtune::testing::write_bytes(bomb, bomb_jpeg(65500));
  ImageFolderDataset data(folder.dir(), ImageFolderOptions().sample_shape({3, 16, 16}));
  try {
    data.get_batch({0});
    FAIL() << "the bomb decoded";
  } catch (const batchtune::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(bomb), std::string::npos) << what;
    EXPECT_NE(what.find("65500x65500"), std::string::npos) << what;
  }
  // 30000x30000 (3 GB, 25 s to decode) too, and --skip-bad-samples skips it.
  batchtune::testing::write_bytes(bomb, bomb_jpeg(30000));
  ImageFolderDataset skipping(folder.dir(),
                              ImageFolderOptions().sample_shape({3, 16, 16}).skip_bad_samples(true));
  const batchtune::Batch batch = skipping.get_batch({0, 1});
  EXPECT_EQ(batch.inputs[0].size(0), 2);
  EXPECT_EQ(skipping.skipped_files(), std::vector<std::string>{bomb});
}

/// Bytes this process has read through read() and the like (`rchar` of
/// /proc/self/io): what a test checks in place of how long a read took.
int64_t bytes_read_by_this_process() {
  std::ifstream io("/proc/self/io");
  std::string key;
  for (int64_t value = 0; io >> key >> value;) {
    if (key == "rchar:") return value;
  }
  ADD_FAILURE() << "/proc/self/io has no rchar";
  return 0;
}

TEST(ImageFolderBounds, HugeFilesAndDevicesAreNotReadWhole) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(2, 4);
  // A sparse 20 GB file: its size is refused before a byte is read.
  const std::string huge = folder.files()[1];
  const int fd = ::open(huge.c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, int64_t{20} << 30), 0);
  ::close(fd);
  // A link to /dev/zero would be read forever.
  const std::string zero = folder.files()[2];
  ::unlink(zero.c_str());
  ASSERT_EQ(::symlink("/dev/zero", zero.c_str()), 0);
  ImageFolderDataset data(folder.dir(), ImageFolderOptions().sample_shape({3, 16, 16}));
  const int64_t read_before = bytes_read_by_this_process();
  for (const auto& [index, named, why] :
       {std::tuple{int64_t{1}, huge, "larger than"}, std::tuple{int64_t{2}, zero, "regular"}}) {
    try {
      data.get_batch({index});
      FAIL() << named << " was read";
    } catch (const batchtune::Error& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  // Refused on their size and kind, before a read: not a block of either.
  EXPECT_LT(bytes_read_by_this_process() - read_before, int64_t{64} << 10);
  ImageFolderDataset skipping(folder.dir(),
                              ImageFolderOptions().sample_shape({3, 16, 16}).skip_bad_samples(true));
  skipping.get_batch({1, 2, 3});
  EXPECT_EQ(skipping.skipped_samples(), 2);
}

// After a truncated JPEG the decoder (one per thread) must start clean: the
// next, good JPEG is decoded, not skipped too. 0, 1 and 2 loader workers.
TEST(ImageFolderBounds, TheDecoderWorksAgainAfterABadFile) {
  BATCHTUNE_REQUIRE_IMAGES();
  ImageFolder folder(2, 4);
  // Files 0 and 2 are class0's JPEGs; 0 is cut in half.
  const std::string bad = folder.files()[0];
  std::ifstream in(bad, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  in.close();
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  for (int64_t workers : {0, 1, 2}) {
    ImageFolderDataset data(folder.dir(),
                            ImageFolderOptions().sample_shape({3, 16, 16}).skip_bad_samples(true));
    int64_t n = 0;
    batchtune::Loader loader(
        data,
        [&](int64_t b) -> std::optional<std::vector<int64_t>> {
          if (b >= 3) return std::nullopt;
          return std::vector<int64_t>{0, 2, 4, 6};  // the bad JPEG, then good JPEGs
        },
        batchtune::LoaderOptions().workers(workers));
    while (auto batch = loader.next()) n += batch->inputs[0].size(0);
    EXPECT_EQ(n, 12) << workers << " workers";
    EXPECT_EQ(data.skipped_files(), std::vector<std::string>{bad}) << workers << " workers";
  }
}

}  // namespace
