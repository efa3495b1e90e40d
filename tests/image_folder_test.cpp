// ImageFolderDataset: listing, decoding JPEG and PNG, augmentation, bad files.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>

#include "batchtune/data/image_folder.h"
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
