#include "batchtune/data/fashion_mnist.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <fstream>
#include <string>
#include <vector>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/data/dataset.h"

namespace batchtune {
namespace {

bool have_debian_files() {
  struct stat st{};
  return ::stat((std::string(kFashionMnistDefaultDir) + "/t10k-images-idx3-ubyte.gz").c_str(),
                &st) == 0;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void write_u32(std::ofstream& out, uint32_t v) {
  const std::array<char, 4> b{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                              static_cast<char>(v >> 8), static_cast<char>(v)};
  out.write(b.data(), 4);
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "batchtune_fmnist_" + name;
  ::mkdir(dir.c_str(), 0755);
  for (const char* f : {"/t10k-images-idx3-ubyte", "/t10k-labels-idx1-ubyte",
                        "/t10k-images-idx3-ubyte.gz", "/t10k-labels-idx1-ubyte.gz"}) {
    std::remove((dir + f).c_str());
  }
  return dir;
}

TEST(FashionMnist, ReadsDebiansGzipFilesNormalised) {
  if (!have_debian_files()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const auto test = load_fashion_mnist(kFashionMnistDefaultDir, FashionMnistSplit::kTest);
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(test->classes(), 10);
  EXPECT_EQ(test->sample_shape(), (std::vector<int64_t>{1, 28, 28}));
  std::vector<int64_t> first(1000);
  for (int64_t i = 0; i < 1000; ++i) first[static_cast<size_t>(i)] = i;
  const Batch batch = test->get_batch(first);
  EXPECT_EQ(batch.inputs[0].sizes(), (std::vector<int64_t>{1000, 1, 28, 28}));
  EXPECT_EQ(batch.inputs[0].scalar_type(), at::kFloat);
  EXPECT_EQ(batch.target.scalar_type(), at::kLong);
  EXPECT_GE(batch.target.min().item<int64_t>(), 0);
  EXPECT_LE(batch.target.max().item<int64_t>(), 9);
  // Normalised with the training set's statistics: near 0 mean, unit spread.
  EXPECT_NEAR(batch.inputs[0].mean().item<double>(), 0.0, 0.1);
  EXPECT_NEAR(batch.inputs[0].std().item<double>(), 1.0, 0.1);
  // The first test label of Fashion-MNIST is 9 (ankle boot).
  EXPECT_EQ(batch.target[0].item<int64_t>(), 9);
}

TEST(FashionMnist, MissingFilesNameTheFileAndThePackage) {
  const std::string message =
      error_of([] { load_fashion_mnist("/nonexistent/fm", FashionMnistSplit::kTrain); });
  EXPECT_NE(message.find("/nonexistent/fm/train-images-idx3-ubyte"), std::string::npos)
      << message;
  EXPECT_NE(message.find("dataset-fashion-mnist"), std::string::npos) << message;
}

TEST(FashionMnist, TruncatedOrMalformedFilesNameTheFile) {
  const std::string dir = fresh_dir("truncated");
  {
    std::ofstream images(dir + "/t10k-images-idx3-ubyte", std::ios::binary);
    for (uint32_t v : {2051U, 10000U, 28U, 28U}) write_u32(images, v);
    images << std::string(1000, '\0');  // far fewer than 10000 x 784 pixels
  }
  std::string message = error_of([&] { load_fashion_mnist(dir, FashionMnistSplit::kTest); });
  EXPECT_NE(message.find(dir + "/t10k-images-idx3-ubyte"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;

  const std::string bad = fresh_dir("magic");
  {
    std::ofstream images(bad + "/t10k-images-idx3-ubyte", std::ios::binary);
    for (uint32_t v : {1234U, 10000U, 28U, 28U}) write_u32(images, v);
  }
  message = error_of([&] { load_fashion_mnist(bad, FashionMnistSplit::kTest); });
  EXPECT_NE(message.find(bad + "/t10k-images-idx3-ubyte"), std::string::npos) << message;
  EXPECT_NE(message.find("magic"), std::string::npos) << message;
}

TEST(FashionMnist, TruncatedGzipNamesTheFile) {
  if (!have_debian_files()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const std::string dir = fresh_dir("gzip");
  {
    std::ifstream in(std::string(kFashionMnistDefaultDir) + "/t10k-images-idx3-ubyte.gz",
                     std::ios::binary);
    std::vector<char> head(20000);
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream(dir + "/t10k-images-idx3-ubyte.gz", std::ios::binary)
        .write(head.data(), in.gcount());
  }
  const std::string message =
      error_of([&] { load_fashion_mnist(dir, FashionMnistSplit::kTest); });
  EXPECT_NE(message.find(dir + "/t10k-images-idx3-ubyte.gz"), std::string::npos) << message;
}

TEST(Dataset, OpenNamesUnknownDataAndFashionMnistTakesADirectory) {
  EXPECT_NE(error_of([] { open_dataset("cifar", {3, 8, 8}, 10, 0); }).find("--data"),
            std::string::npos);
  EXPECT_NE(error_of([] { open_dataset("fashion-mnist:/nonexistent", {3, 8, 8}, 10, 0); })
                .find("/nonexistent"),
            std::string::npos);
  const DataSplits synthetic = open_dataset("synthetic", {3, 8, 8}, 5, 1);
  EXPECT_EQ(synthetic.test, nullptr);
  EXPECT_EQ(synthetic.train->sample_shape(), (std::vector<int64_t>{3, 8, 8}));
}

TEST(Dataset, ADataErrorCarriesItsOptionAndTheValueGiven) {
  try {
    open_dataset("fashion-mnist:/nonexistent", {1, 28, 28}, 10, 0);
    FAIL() << "a missing directory was accepted";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), Option::kData);
    EXPECT_EQ(e.value(), "fashion-mnist:/nonexistent");
    // The CLI's text as it was; Python names the option its own way.
    EXPECT_EQ(std::string(e.what()).rfind("--data fashion-mnist:/nonexistent: ", 0), 0u)
        << e.what();
    EXPECT_EQ(e.message(FrontEnd::kPython).rfind("data fashion-mnist:/nonexistent: ", 0), 0u);
  }
  try {
    open_dataset("text:", {16}, 10, 0);
    FAIL() << "text without a directory was accepted";
  } catch (const OptionError& e) {
    EXPECT_STREQ(e.what(), "--data text: give the directory, as text:DIR (each file a document)");
  }
}

TEST(Dataset, SyntheticSamplesDoNotDependOnTheirBatch) {
  SyntheticDataset data({2, 4, 4}, 7, 100, 42);
  const Batch a = data.get_batch({3, 10, 99});
  const Batch b = data.get_batch({10});
  EXPECT_TRUE(at::equal(a.inputs[0][1], b.inputs[0][0]));
  EXPECT_TRUE(at::equal(a.target[1], b.target[0]));
  EXPECT_FALSE(at::equal(a.inputs[0][0], a.inputs[0][1]));
  EXPECT_LT(a.target.max().item<int64_t>(), 7);
}

}  // namespace
}  // namespace batchtune
