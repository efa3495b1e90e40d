// write_file_atomically against what a path can be: a regular file (mode
// kept), a symlink (its target written), a device, a FIFO, stdout; and the
// checks of output paths made before any work.
#include "batchtune/common/atomic_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "batchtune/common/error.h"
#include "cli_runner.h"
#include "image_folder_fixture.h"

namespace {

using batchtune::check_output_file;
using batchtune::prepare_output_directory;
using batchtune::write_file_atomically;

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/batchtune-atomic-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override { batchtune::testing::remove_tree(dir_); }

  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }

  std::string dir_;
};

TEST_F(AtomicFile, ReplacesARegularFileAndKeepsItsMode) {
  const std::string path = dir_ + "/out.json";
  std::ofstream(path) << "old";
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  write_file_atomically(path, "new");
  EXPECT_EQ(read(path), "new");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600U);
}

TEST_F(AtomicFile, WritesASymlinksTargetAndKeepsTheLink) {
  const std::string target = dir_ + "/target.json";
  const std::string link = dir_ + "/link.json";
  std::ofstream(target) << "old";
  ASSERT_EQ(::symlink("target.json", link.c_str()), 0);  // relative, as users make them
  write_file_atomically(link, "new");
  struct stat st {};
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced";
  EXPECT_EQ(read(target), "new");
  // A dangling link names the file to create.
  const std::string dangling = dir_ + "/dangling.json";
  ASSERT_EQ(::symlink((dir_ + "/made.json").c_str(), dangling.c_str()), 0);
  write_file_atomically(dangling, "made");
  ASSERT_EQ(::lstat(dangling.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(read(dir_ + "/made.json"), "made");
}

TEST_F(AtomicFile, WritesADeviceInPlace) {
  write_file_atomically("/dev/null", "discarded");
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/null was replaced";
  // A symlink to a device, as /dev/stdout is: the link and the device stay.
  const std::string link = dir_ + "/null.json";
  ASSERT_EQ(::symlink("/dev/null", link.c_str()), 0);
  write_file_atomically(link, "discarded");
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  if (::stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode)) {
    try {
      write_file_atomically("/dev/full", "no room");
      FAIL() << "a write to /dev/full succeeded";
    } catch (const batchtune::Error& e) {
      EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
    }
    ASSERT_EQ(::stat("/dev/full", &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/full was replaced";
  }
}

TEST_F(AtomicFile, WritesAFifoInPlace) {
  const std::string fifo = dir_ + "/pipe.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::string received;
  std::thread reader([&] { received = read(fifo); });
  write_file_atomically(fifo, "through the pipe");
  reader.join();
  EXPECT_EQ(received, "through the pipe");
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
}

TEST_F(AtomicFile, AMissingFolderOrAFolderIsAnErrorNamingThePath) {
  EXPECT_THROW(write_file_atomically(dir_ + "/no/such/out.json", "x"), batchtune::Error);
  EXPECT_THROW(write_file_atomically(dir_, "x"), batchtune::Error);
  try {
    check_output_file(dir_ + "/missing/out.json", "--json");
    FAIL() << "a missing folder passed";
  } catch (const batchtune::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--json ", 0), 0U) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  try {
    check_output_file(dir_, "--report");
    FAIL() << "a folder passed";
  } catch (const batchtune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a folder"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_output_file(dir_ + "/new.json", "--json"));
  EXPECT_NO_THROW(check_output_file("/dev/null", "--json"));
  EXPECT_NO_THROW(check_output_file("-", "--json"));
}

TEST_F(AtomicFile, PrepareOutputDirectoryMakesParentsAndSaysWhatFailed) {
  prepare_output_directory(dir_ + "/a/b/c", "--checkpoint");
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/a/b/c").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  std::ofstream(dir_ + "/file") << "x";
  try {
    prepare_output_directory(dir_ + "/file/sub", "--checkpoint");
    FAIL() << "a folder under a file was made";
  } catch (const batchtune::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot create the folder"), std::string::npos) << what;
    EXPECT_NE(what.find("mkdir"), std::string::npos) << what;
  }
  EXPECT_THROW(prepare_output_directory(dir_ + "/file", "--checkpoint"), batchtune::Error);
}

TEST_F(AtomicFile, AClosedOrFullStdoutFailsLoudly) {
  // `--json -` with stdout closed, and with stdout on /dev/full.
  for (const char* redirect : {" >&-", " >/dev/full"}) {
    struct stat st {};
    if (std::string(redirect).find("full") != std::string::npos &&
        ::stat("/dev/full", &st) != 0) {
      continue;
    }
    // stderr to the pipe that is read, then stdout redirected.
    const std::string command = std::string(BATCHTUNE_CLI_PATH) +
                                " plan --batch-size 8 --model mlp --input 1x8x8 --device cpu "
                                "--amp off --json - 2>&1" + redirect;
    batchtune::testing::CliResult r;
    FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    char buffer[4096];
    size_t n = 0;
    while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
    const int status = pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    EXPECT_EQ(r.exit_code, 2) << redirect << ": " << r.output;
    EXPECT_NE(r.output.find("standard output"), std::string::npos) << redirect << ": "
                                                                   << r.output;
  }
}

}  // namespace
