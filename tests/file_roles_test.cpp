// Outputs against other outputs and inputs, by the file they resolve to;
// inputs that are not regular files; the checkpoint folder's lock; exports
// after a finished run (issue 27).

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "batchtune/common/error.h"
#include "batchtune/common/file_roles.h"
#include "batchtune/training/checkpoint.h"
#include "cli_runner.h"
#include "image_folder_fixture.h"

namespace {

using batchtune::Error;
using batchtune::FileAccess;
using batchtune::FileRole;
using batchtune::FrontEnd;
using batchtune::Option;
using batchtune::OptionError;
using batchtune::check_file_roles;
using batchtune::check_input_file;
using batchtune::testing::run_cli;

/// A fresh folder under the test's temporary directory, removed at the end.
class Folder {
 public:
  Folder() {
    std::string path = ::testing::TempDir() + "batchtune-files-XXXXXX";
    if (::mkdtemp(path.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = path;
  }
  ~Folder() { batchtune::testing::remove_tree(dir_); }
  std::string operator/(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
};

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string message_of(const std::vector<FileRole>& roles) {
  try {
    check_file_roles(roles);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FileRoles, AnOutputOntoAnInputOrAnotherOutputIsRefusedNamingBothFlags) {
  Folder f;
  write(f / "p.json", "{}");
  const std::string m = message_of({{"--plan", f / "p.json", FileAccess::kRead},
                                    {"--json", f / "p.json", FileAccess::kWrite}});
  EXPECT_NE(m.find("--json"), std::string::npos) << m;
  EXPECT_NE(m.find("--plan"), std::string::npos) << m;
  // Two outputs, the file not there yet, spelled differently.
  const std::string two = message_of({{"--json", f / "x.html", FileAccess::kWrite},
                                      {"--report", f.path() + "/./x.html", FileAccess::kWrite}});
  EXPECT_NE(two.find("--report"), std::string::npos) << two;
  EXPECT_NE(two.find("--json"), std::string::npos) << two;
  // Two to standard output.
  EXPECT_NE(message_of({{"--json", "-", FileAccess::kWrite}, {"--report", "-", FileAccess::kWrite}})
                .find("standard output"),
            std::string::npos);
}

TEST(FileRoles, LinksAndHardLinksResolveToTheirFile) {
  Folder f;
  write(f / "model.pt", "weights");
  ASSERT_EQ(::symlink((f / "model.pt").c_str(), (f / "link.pt").c_str()), 0);
  ASSERT_EQ(::link((f / "model.pt").c_str(), (f / "hard.pt").c_str()), 0);
  EXPECT_FALSE(message_of({{"--model", f / "model.pt", FileAccess::kRead},
                           {"--json", f / "link.pt", FileAccess::kWrite}})
                   .empty());
  EXPECT_FALSE(message_of({{"--model", f / "model.pt", FileAccess::kRead},
                           {"--json", f / "hard.pt", FileAccess::kWrite}})
                   .empty());
}

TEST(FileRoles, DistinctFilesDevicesAndTwoReadsPass) {
  Folder f;
  write(f / "p.json", "{}");
  EXPECT_EQ(message_of({{"--plan", f / "p.json", FileAccess::kRead},
                        {"--json", f / "out.json", FileAccess::kWrite},
                        {"--report", f / "out.html", FileAccess::kWrite},
                        {"--input-spec", "", FileAccess::kRead}}),
            "");
  EXPECT_EQ(message_of({{"--json", "/dev/null", FileAccess::kWrite},
                        {"--report", "/dev/null", FileAccess::kWrite}}),
            "");
  EXPECT_EQ(message_of({{"--plan", f / "p.json", FileAccess::kRead},
                        {"--input-spec", f / "p.json", FileAccess::kRead}}),
            "");
}

TEST(FileRoles, AnOutputInsideTheDataFolderIsRefused) {
  Folder f;
  ASSERT_EQ(::mkdir((f / "images").c_str(), 0755), 0);
  const std::string m = message_of({{"--data", f / "images", FileAccess::kReadFolder},
                                    {"--json", f / "images/cat/a.jpg", FileAccess::kWrite}});
  EXPECT_NE(m.find("--data"), std::string::npos) << m;
  // Beside the folder, or in a folder whose name starts the same, is fine.
  EXPECT_EQ(message_of({{"--data", f / "images", FileAccess::kReadFolder},
                        {"--json", f / "images.json", FileAccess::kWrite}}),
            "");
}

TEST(FileRoles, InputsThatAreNotRegularFilesAreRefusedWithoutOpeningThem) {
  Folder f;
  ASSERT_EQ(::mkfifo((f / "pipe").c_str(), 0644), 0);
  try {
    check_input_file(f / "pipe", Option::kPlan);  // would block in open()
    FAIL() << "a FIFO was accepted";
  } catch (const OptionError& e) {
    EXPECT_NE(std::string(e.what()).find("FIFO"), std::string::npos) << e.what();
    // The option and the path given to it, as each front end names the option.
    EXPECT_EQ(std::string(e.what()).rfind("--plan " + (f / "pipe") + ": is a named pipe", 0), 0u)
        << e.what();
    EXPECT_EQ(e.message(FrontEnd::kPython).rfind("plan " + (f / "pipe") + ": ", 0), 0u);
  }
  EXPECT_THROW(check_input_file(f.path(), Option::kPlan), Error);
  EXPECT_THROW(check_input_file(f / "missing.json", Option::kPlan), Error);
  write(f / "ok.json", "{}");
  EXPECT_NO_THROW(check_input_file(f / "ok.json", Option::kPlan));
}

// Through the real CLI: each exits 2 at once and leaves the other file whole.
TEST(FileRolesCli, AnOutputNamingAFileTheCommandReadsDestroysNothing) {
  Folder f;
  write(f / "m.pt", "not really a model");
  auto r = run_cli("probe --batch-size 2 --model " + (f / "m.pt") + " --json " + (f / "m.pt"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--model"), std::string::npos) << r.output;
  EXPECT_EQ(read(f / "m.pt"), "not really a model");

  r = run_cli("plan --batch-size 4 --model mlp --input 1x8x8 --device cpu --amp off --json " +
              (f / "p.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string plan = read(f / "p.json");
  r = run_cli("train --plan " + (f / "p.json") + " --model mlp --input 1x8x8 --steps 1 --json " +
              (f / "p.json"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(read(f / "p.json"), plan);

  ASSERT_EQ(::symlink((f / "x.html").c_str(), (f / "y.html").c_str()), 0);
  r = run_cli("tune --json " + (f / "x.html") + " --report " + (f / "y.html"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--report"), std::string::npos) << r.output;
}

TEST(FileRolesCli, JsonOntoTheCheckpointOrATrainingImageIsRefused) {
  Folder f;
  auto r = run_cli("train --model mlp --input 1x8x8 --device cpu --batch-size 2 --steps 1 "
                   "--checkpoint " + (f / "ckpt") + " --json " + (f / "ckpt/checkpoint.pt"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--checkpoint"), std::string::npos) << r.output;

  batchtune::testing::ImageFolder images(2, 2);
  const std::string image = images.files().front();
  struct stat before {};
  ASSERT_EQ(::stat(image.c_str(), &before), 0);
  r = run_cli("train --data imagefolder:" + images.dir() +
              " --model lenet --input 1x28x28 --batch-size 2 --steps 1 --json " + image);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--data"), std::string::npos) << r.output;
  struct stat after {};
  ASSERT_EQ(::stat(image.c_str(), &after), 0);
  EXPECT_EQ(after.st_size, before.st_size);
}

TEST(FileRolesCli, AFifoAsPlanInputSpecModelOrCheckpointEndsAtOnce) {
  Folder f;
  ASSERT_EQ(::mkfifo((f / "fifo").c_str(), 0644), 0);
  for (const std::string& args :
       {"plan --plan " + (f / "fifo"), "probe --batch-size 2 --input-spec " + (f / "fifo"),
        "probe --batch-size 2 --model " + (f / "fifo")}) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find("FIFO"), std::string::npos) << r.output;
  }
  ASSERT_EQ(::mkdir((f / "ckpt").c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo((f / "ckpt/checkpoint.pt").c_str(), 0644), 0);
  const auto r = run_cli("train --model mlp --input 1x8x8 --device cpu --batch-size 2 --steps 1 "
                         "--resume --checkpoint " + (f / "ckpt"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("FIFO"), std::string::npos) << r.output;
}

TEST(FileRolesCli, ASecondRunOnOneCheckpointFolderStopsAtOnce) {
  Folder f;
  ASSERT_EQ(::mkdir((f / "ckpt").c_str(), 0755), 0);
  batchtune::CheckpointLock held(f / "ckpt");  // as a run in progress holds it
  const auto r = run_cli("train --model mlp --input 1x8x8 --device cpu --batch-size 2 --steps 1 "
                         "--checkpoint " + (f / "ckpt"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("another run"), std::string::npos) << r.output;
  struct stat st {};
  EXPECT_NE(::stat((f / "ckpt/checkpoint.pt").c_str(), &st), 0) << "the second run wrote";
}

TEST(FileRolesCli, ResumingAFinishedRunRewritesExportsAKillLeftMissing) {
  Folder f;
  const std::string train = "train --model mlp --input 1x8x8 --device cpu --batch-size 2 "
                            "--steps 2 --checkpoint " + (f / "ckpt");
  auto r = run_cli(train);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string weights = read(f / "ckpt/model.pt");
  ASSERT_FALSE(weights.empty());
  std::remove((f / "ckpt/model.pt").c_str());  // as a kill while it was written
  r = run_cli(train + " --resume");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("already finished"), std::string::npos) << r.output;
  EXPECT_EQ(read(f / "ckpt/model.pt"), weights);
}

TEST(FileRolesCli, ResumeWithoutACheckpointSaysItStartsAfresh) {
  Folder f;
  const auto r = run_cli("train --model mlp --input 1x8x8 --device cpu --batch-size 2 --steps 1 "
                         "--resume --checkpoint " + (f / "ckpt"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("starts the run afresh"), std::string::npos) << r.output;
}

}  // namespace
