#include "common/os/file_system.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Wraps the default file system; can fail Append or Rename.
class FaultyFileSystem : public ForwardingFileSystem {
 public:
  FaultyFileSystem() : ForwardingFileSystem(FileSystem::Default()) {}
  bool fail_append = false;
  bool fail_rename = false;

  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    SFT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, base()->NewWritableFile(path));
    if (!fail_append) return f;
    return std::unique_ptr<WritableFile>(new FailingFile(std::move(f)));
  }
  Status Rename(const std::string& from, const std::string& to) override {
    if (fail_rename) return InternalError("injected rename failure");
    return base()->Rename(from, to);
  }

 private:
  class FailingFile : public WritableFile {
   public:
    explicit FailingFile(std::unique_ptr<WritableFile> base) : base_(std::move(base)) {}
    Status Append(std::string_view data) override {
      // Write half, then fail, like a full disk.
      SFT_RETURN_IF_ERROR(base_->Append(data.substr(0, data.size() / 2)));
      return ResourceExhaustedError("injected: no space left");
    }
    Status Sync() override { return base_->Sync(); }
    Status Close() override { return base_->Close(); }

   private:
    std::unique_ptr<WritableFile> base_;
  };
};

class FileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::sftctl::testing::MakeTempDir("file-system");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { ASSERT_TRUE(fs_->RemoveAll(dir_).ok()); }

  std::string Path(const std::string& name) const { return JoinPath(dir_, name); }

  std::string Read(const std::string& path) {
    StatusOr<std::string> s = fs_->ReadFile(path);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : std::string();
  }

  std::vector<std::string> List(const std::string& path) {
    StatusOr<std::vector<std::string>> s = fs_->ListDir(path);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : std::vector<std::string>();
  }

  FileSystem* fs_ = FileSystem::Default();
  std::string dir_;
};

TEST(JoinPathTest, Joins) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("a", "/b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "/b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(JoinPath("a", ""), "a");
  EXPECT_EQ(JoinPath("/", "b"), "/b");
}

TEST_F(FileSystemTest, WriteFileAtomicCreatesAndReplaces) {
  const std::string path = Path("f.txt");
  ASSERT_TRUE(WriteFileAtomic(fs_, path, "first").ok());
  EXPECT_EQ(Read(path), "first");
  ASSERT_TRUE(WriteFileAtomic(fs_, path, "second, longer").ok());
  EXPECT_EQ(Read(path), "second, longer");
  ASSERT_TRUE(WriteFileAtomic(fs_, path, "").ok());
  EXPECT_EQ(Read(path), "");
  EXPECT_THAT(List(dir_), ElementsAre("f.txt"));  // no temporary left behind
}

TEST_F(FileSystemTest, WriteFileAtomicBinaryAndLarge) {
  std::string data(200'000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  const std::string path = Path("big.bin");
  ASSERT_TRUE(WriteFileAtomic(fs_, path, data).ok());
  EXPECT_EQ(Read(path), data);
}

TEST_F(FileSystemTest, WriteFileAtomicInMissingDirectory) {
  Status s = WriteFileAtomic(fs_, Path("nope/f.txt"), "x");
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("nope/f.txt"));
  EXPECT_FALSE(fs_->Exists(Path("nope")));
}

TEST_F(FileSystemTest, WriteFileAtomicFailedAppendKeepsOldContent) {
  const std::string path = Path("f.txt");
  ASSERT_TRUE(WriteFileAtomic(fs_, path, "old").ok());
  FaultyFileSystem faulty;
  faulty.fail_append = true;
  Status s = WriteFileAtomic(&faulty, path, "new content");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(Read(path), "old");
  EXPECT_THAT(List(dir_), ElementsAre("f.txt"));  // the half-written temporary was removed
}

TEST_F(FileSystemTest, WriteFileAtomicFailedRenameKeepsOldContent) {
  const std::string path = Path("f.txt");
  ASSERT_TRUE(WriteFileAtomic(fs_, path, "old").ok());
  FaultyFileSystem faulty;
  faulty.fail_rename = true;
  Status s = WriteFileAtomic(&faulty, path, "new");
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_EQ(s.message(), "injected rename failure");
  EXPECT_EQ(Read(path), "old");
  EXPECT_THAT(List(dir_), ElementsAre("f.txt"));
}

TEST_F(FileSystemTest, ListDirIsSortedWithoutDots) {
  for (const char* name : {"b", "a", "C", "10", "9", ".hidden"})
    ASSERT_TRUE(WriteFileAtomic(fs_, Path(name), name).ok());
  ASSERT_TRUE(fs_->CreateDirs(Path("sub")).ok());
  EXPECT_THAT(List(dir_), ElementsAre(".hidden", "10", "9", "C", "a", "b", "sub"));
  EXPECT_THAT(List(Path("sub")), IsEmpty());
}

TEST_F(FileSystemTest, ListDirErrors) {
  StatusOr<std::vector<std::string>> s = fs_->ListDir(Path("missing"));
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("missing"));
  ASSERT_TRUE(WriteFileAtomic(fs_, Path("file"), "x").ok());
  EXPECT_FALSE(fs_->ListDir(Path("file")).ok());
}

TEST_F(FileSystemTest, RemoveAll) {
  EXPECT_TRUE(fs_->RemoveAll(Path("missing")).ok());
  EXPECT_TRUE(fs_->RemoveAll(Path("missing/deeper")).ok());

  ASSERT_TRUE(fs_->CreateDirs(Path("t/x/y")).ok());
  ASSERT_TRUE(WriteFileAtomic(fs_, Path("t/x/y/f"), "1").ok());
  ASSERT_TRUE(WriteFileAtomic(fs_, Path("t/g"), "2").ok());
  EXPECT_TRUE(fs_->RemoveAll(Path("t")).ok());
  EXPECT_FALSE(fs_->Exists(Path("t")));

  ASSERT_TRUE(WriteFileAtomic(fs_, Path("file"), "x").ok());
  EXPECT_TRUE(fs_->RemoveAll(Path("file")).ok());
  EXPECT_FALSE(fs_->Exists(Path("file")));
}

TEST_F(FileSystemTest, CreateDirs) {
  const std::string deep = Path("a/b/c");
  ASSERT_TRUE(fs_->CreateDirs(deep).ok());
  EXPECT_TRUE(fs_->IsDirectory(deep));
  EXPECT_TRUE(fs_->CreateDirs(deep).ok());  // idempotent
  ASSERT_TRUE(WriteFileAtomic(fs_, Path("file"), "x").ok());
  EXPECT_FALSE(fs_->CreateDirs(Path("file")).ok());
  EXPECT_FALSE(fs_->CreateDirs(Path("file/sub")).ok());
}

TEST_F(FileSystemTest, ExistsAndIsDirectory) {
  ASSERT_TRUE(WriteFileAtomic(fs_, Path("file"), "x").ok());
  EXPECT_TRUE(fs_->Exists(Path("file")));
  EXPECT_FALSE(fs_->IsDirectory(Path("file")));
  EXPECT_TRUE(fs_->Exists(dir_));
  EXPECT_TRUE(fs_->IsDirectory(dir_));
  EXPECT_FALSE(fs_->Exists(Path("missing")));
  EXPECT_FALSE(fs_->IsDirectory(Path("missing")));
}

TEST_F(FileSystemTest, ReadFileMissing) {
  StatusOr<std::string> s = fs_->ReadFile(Path("missing"));
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("cannot open '" + Path("missing") + "'"));
}

TEST_F(FileSystemTest, WritableFileAppendSyncClose) {
  StatusOr<std::unique_ptr<WritableFile>> f = fs_->NewWritableFile(Path("w"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE((*f)->Append("ab").ok());
  EXPECT_TRUE((*f)->Append(std::string_view("c\0d", 3)).ok());
  EXPECT_TRUE((*f)->Sync().ok());
  EXPECT_TRUE((*f)->Close().ok());
  EXPECT_TRUE((*f)->Close().ok());  // a second Close is harmless
  EXPECT_EQ(Read(Path("w")), std::string("abc\0d", 5));

  // NewWritableFile truncates.
  f = fs_->NewWritableFile(Path("w"));
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*f)->Close().ok());
  EXPECT_EQ(Read(Path("w")), "");

  // Destroying without Close still closes and keeps the data.
  {
    StatusOr<std::unique_ptr<WritableFile>> g = fs_->NewWritableFile(Path("w2"));
    ASSERT_TRUE(g.ok());
    EXPECT_TRUE((*g)->Append("kept").ok());
  }
  EXPECT_EQ(Read(Path("w2")), "kept");

  StatusOr<std::unique_ptr<WritableFile>> bad = fs_->NewWritableFile(Path("missing/w"));
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
}

TEST_F(FileSystemTest, AppendableFileKeepsContentAppendsAtTheEndAndReadsAtOffsets) {
  ASSERT_TRUE(WriteFileAtomic(fs_, Path("a"), "old").ok());
  ForwardingFileSystem forwarding(fs_);  // forwards NewAppendableFile too
  StatusOr<std::unique_ptr<AppendableFile>> f = forwarding.NewAppendableFile(Path("a"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(*(*f)->Size(), 3u);
  EXPECT_TRUE((*f)->Append("+new").ok());
  char buf[16];
  EXPECT_EQ(*(*f)->ReadAt(2, sizeof(buf), buf), 5u);
  EXPECT_EQ(std::string(buf, 5), "d+new");
  EXPECT_EQ(*(*f)->ReadAt(7, sizeof(buf), buf), 0u);  // at the end
  EXPECT_EQ(*(*f)->ReadAt(99, sizeof(buf), buf), 0u);

  // Append goes to the end also after Truncate.
  EXPECT_TRUE((*f)->Truncate(2).ok());
  EXPECT_EQ(*(*f)->Size(), 2u);
  EXPECT_TRUE((*f)->Append("X").ok());
  EXPECT_TRUE((*f)->Sync().ok());
  EXPECT_TRUE((*f)->Close().ok());
  EXPECT_TRUE((*f)->Close().ok());  // a second Close is harmless
  EXPECT_EQ(Read(Path("a")), "olX");

  // A missing file is created empty.
  StatusOr<std::unique_ptr<AppendableFile>> g = fs_->NewAppendableFile(Path("new"));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(*(*g)->Size(), 0u);
  EXPECT_TRUE(fs_->Exists(Path("new")));

  EXPECT_EQ(fs_->NewAppendableFile(Path("missing/a")).status().code(), StatusCode::kNotFound);
}

TEST_F(FileSystemTest, RenameAndSyncDir) {
  ASSERT_TRUE(WriteFileAtomic(fs_, Path("a"), "A").ok());
  ASSERT_TRUE(WriteFileAtomic(fs_, Path("b"), "B").ok());
  ASSERT_TRUE(fs_->Rename(Path("a"), Path("b")).ok());  // replaces
  EXPECT_EQ(Read(Path("b")), "A");
  EXPECT_FALSE(fs_->Exists(Path("a")));
  Status s = fs_->Rename(Path("a"), Path("c"));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(fs_->SyncDir(dir_).ok());
  EXPECT_EQ(fs_->SyncDir(Path("missing")).code(), StatusCode::kNotFound);
}

TEST(FileSystemDefaultTest, IsASingleton) {
  EXPECT_NE(FileSystem::Default(), nullptr);
  EXPECT_EQ(FileSystem::Default(), FileSystem::Default());
}

TEST(WriteFullyTest, WritesEverythingThroughAPipe) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string data(40000, 'x');  // less than a pipe's buffer: no reader needed
  ASSERT_TRUE(WriteFully(fds[1], data, "pipe").ok());
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  EXPECT_EQ(got, data);
}

TEST(WriteFullyTest, ErrorNamesThePath) {
  Status s = WriteFully(-1, "data", "/some/file");
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "cannot write '/some/file': Bad file descriptor");
}

// Two writers of one path at once (two processes sharing a Hub cache's refs/main, seen failing
// with one temporary name for both): each write succeeds, the file holds one whole value, and no
// temporary file is left behind.
TEST(WriteFileAtomic, ConcurrentWritersOfOnePathEachSucceed) {
  testing::TempDir tmp;
  const std::string path = tmp.path() + "/main";
  std::vector<std::thread> writers;
  std::vector<int> failures(4, 0);
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < 50; ++i)
        failures[w] += WriteFileAtomic(FileSystem::Default(), path, std::string(4096, 'a' + w)).ok() ? 0 : 1;
    });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
  const std::string got = *FileSystem::Default()->ReadFile(path);
  ASSERT_EQ(got.size(), 4096u);
  EXPECT_EQ(got, std::string(4096, got[0]));
  EXPECT_EQ(*FileSystem::Default()->ListDir(tmp.path()), std::vector<std::string>{"main"});
}

// The private-file policy: a file behind a planted link is never written, the mode is explicit.
TEST(WritePrivateFile, WritesA0600FileAndReplacesPlantedLinksWithoutFollowingThem) {
  testing::TempDir tmp;
  const std::string victim = tmp.path() + "/victim", other = tmp.path() + "/other";
  for (const std::string& v : {victim, other})
    ASSERT_TRUE(WriteFileAtomic(FileSystem::Default(), v, "mine").ok());
  const std::string path = tmp.path() + "/job.sbatch";
  ASSERT_EQ(::symlink(victim.c_str(), path.c_str()), 0);
  ASSERT_EQ(::symlink(other.c_str(), (path + ".tmp").c_str()), 0);
  ASSERT_TRUE(WritePrivateFile(path, "#!/bin/bash\n").ok());
  EXPECT_EQ(*FileSystem::Default()->ReadFile(victim), "mine");
  EXPECT_EQ(*FileSystem::Default()->ReadFile(other), "mine");
  EXPECT_EQ(*FileSystem::Default()->ReadFile(path), "#!/bin/bash\n");
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_FALSE(FileSystem::Default()->Exists(path + ".tmp"));
  const Status s = WritePrivateFile(tmp.path() + "/missing/x", "y");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("cannot create '" + tmp.path() + "/missing/x.tmp'"));
}

TEST(MakePrivateDir, MakesA0700FolderAndExclusiveRefusesAnExistingOne) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/job-1";
  ASSERT_TRUE(MakePrivateDir(dir, true).ok());
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  Status s = MakePrivateDir(dir, true);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(),
            "'" + dir + "' already exists: refusing to reuse a folder this agent did not create");
  // Not exclusive: an existing folder of this user is accepted and made private.
  ASSERT_EQ(::chmod(dir.c_str(), 0775), 0);
  ASSERT_TRUE(MakePrivateDir(dir, false).ok());
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  // ... but not a link to one.
  ASSERT_EQ(::symlink(dir.c_str(), (tmp.path() + "/link").c_str()), 0);
  s = MakePrivateDir(tmp.path() + "/link", false);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("is not a folder of this user"));
}

TEST(CheckTrustedDir, RefusesAFolderOthersMayWriteOrAnotherUserOwns) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/shared";
  ASSERT_TRUE(MakePrivateDir(dir, true).ok());
  EXPECT_TRUE(CheckTrustedDir(dir, "--shared-dir").ok());
  ASSERT_EQ(::chmod(dir.c_str(), 0775), 0);
  Status s = CheckTrustedDir(dir, "--shared-dir");
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "--shared-dir " + dir +
                             " is writable by group or others (mode 0775): another user could plant or swap "
                             "files there; run `chmod go-w " +
                             dir + "`");
  ASSERT_EQ(::chmod(dir.c_str(), 0757), 0);
  EXPECT_EQ(CheckTrustedDir(dir, "--shared-dir").code(), StatusCode::kPermissionDenied);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  // Another user's folder: one of root's when this is not root, else one given away.
  std::string foreign = "/usr/share";
  if (::geteuid() == 0) {
    foreign = dir;
    ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
  }
  s = CheckTrustedDir(foreign, "--shared-dir");
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("--shared-dir " + foreign + " belongs to uid "));
  EXPECT_THAT(s.message(), HasSubstr("not to this user (uid " + std::to_string(::geteuid()) + ")"));
  const std::string file = tmp.path() + "/file";
  ASSERT_TRUE(WriteFileAtomic(FileSystem::Default(), file, "x").ok());
  EXPECT_EQ(CheckTrustedDir(file, "--shared-dir").code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sftctl
