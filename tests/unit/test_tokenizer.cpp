// Byte tokenizer round trips, and Corpus loading errors (with temporary files; loads that
// could hang or exhaust memory run in a child process).
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "trireme/common/error.h"
#include "trireme/data/corpus.h"
#include "trireme/data/tokenizer.h"

using trireme::InvalidArgument;
using trireme::data::ByteTokenizer;
using trireme::data::Corpus;

namespace {

// A file under a fresh temporary directory, removed at the end of the test.
class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    char tmpl[] = "/tmp/trireme_corpus_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/text.txt";
    std::ofstream(path_, std::ios::binary) << content;
  }
  ~TempFile() {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, path_;
};

std::string error_of(const std::string& path) {
  try {
    Corpus::load(path);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// Limits of error_in_child's child: a load that works takes milliseconds and a few KB.
constexpr unsigned kChildSeconds = 10;
constexpr rlim_t kChildBytes = rlim_t{1} << 30;
// The unprivileged user ("nobody") a root test process drops to.
constexpr uid_t kNobody = 65534;

// error_of(path) in a child process with kChildSeconds of time and kChildBytes of address
// space, so that a load that blocks (opening a pipe) or reads without end (a device) fails
// the test instead of hanging it or exhausting the machine's memory (running out of its
// address space is an "unexpected error: std::bad_alloc"). With as_nobody, the
// child first becomes kNobody (permission checks mean nothing to root). Returns
// "setuid failed" when it cannot.
std::string error_in_child(const std::string& path, bool as_nobody = false) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe() failed";
  const pid_t pid = ::fork();
  if (pid < 0) return "fork() failed";
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(kChildSeconds);
    const rlimit limit{kChildBytes, kChildBytes};
    ::setrlimit(RLIMIT_AS, &limit);
    const bool dropped =
        !as_nobody || (::setgroups(0, nullptr) == 0 && ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0);
    std::string err = "setuid failed";
    try {  // nothing may escape into gtest, which would go on running tests in this child
      if (dropped) err = error_of(path);
    } catch (const std::exception& e) {
      err = std::string("unexpected error: ") + e.what();
    }
    size_t done = 0;
    while (done < err.size()) {
      const ssize_t n = ::write(fds[1], err.data() + done, err.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string err;
  char buffer[512];
  for (;;) {
    const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    err.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    return "child killed by signal " + std::to_string(WTERMSIG(status)) +
           " (the load blocked or ran too long)";
  return err;
}

}  // namespace

TEST(TokenizerTest, RoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const auto ids = ByteTokenizer::encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(ByteTokenizer::decode(ids), all);
  EXPECT_EQ(ByteTokenizer::vocab_size(), 256);
}

TEST(TokenizerTest, Utf8BecomesItsBytes) {
  EXPECT_EQ(ByteTokenizer::encode("é"), (std::vector<int64_t>{0xC3, 0xA9}));
  EXPECT_TRUE(ByteTokenizer::encode("").empty());
}

TEST(TokenizerTest, DecodeRejectsIdsOutsideBytes) {
  EXPECT_THROW(ByteTokenizer::decode({65, 256}), InvalidArgument);
  EXPECT_THROW(ByteTokenizer::decode({-1}), InvalidArgument);
}

TEST(CorpusTest, LoadsBytes) {
  TempFile f("In the beginning\n");
  const Corpus c = Corpus::load(f.path());
  EXPECT_EQ(c.size(), 17u);
  EXPECT_EQ(c.bytes()[0], 'I');
  EXPECT_NO_THROW(c.require_length(16));
}

TEST(CorpusTest, MissingFileNamesTheReason) {
  EXPECT_EQ(error_of("/nonexistent/x/y.txt"),
            "--data /nonexistent/x/y.txt: cannot read (No such file or directory); give a "
            "readable UTF-8 text file");
}

TEST(CorpusTest, DirectoryIsRejected) {
  TempFile f("x");
  EXPECT_NE(error_of(f.dir()).find("is a directory"), std::string::npos);
}

TEST(CorpusTest, UnreadableFileIsRejected) {
  TempFile f("text");
  ::chmod(f.path().c_str(), 0);
  ::chmod(f.dir().c_str(), 0755);  // the file itself, not its directory, is unreadable
  // Root reads any file: as root, the load runs as an unprivileged user.
  const std::string err = error_in_child(f.path(), /*as_nobody=*/::geteuid() == 0);
  if (err == "setuid failed") GTEST_SKIP() << "running as root and cannot become user nobody";
  EXPECT_NE(err.find("cannot read (Permission denied)"), std::string::npos) << err;
}

// /dev/zero reports size 0 and never ends; it used to be read until memory ran out.
TEST(CorpusTest, DeviceIsRejected) {
  EXPECT_EQ(error_in_child("/dev/zero"),
            "--data /dev/zero: is not a regular file (a device, pipe or socket); save the text to "
            "a file and give its path");
}

// Opening a named pipe waits for a writer; it used to block forever.
TEST(CorpusTest, NamedPipeIsRejected) {
  TempFile f("x");
  const std::string fifo = f.dir() + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  EXPECT_EQ(error_in_child(fifo), "--data " + fifo +
                                      ": is not a regular file (a device, pipe or socket); save "
                                      "the text to a file and give its path");
  ::unlink(fifo.c_str());
}

TEST(CorpusTest, EmptyFileIsRejected) {
  TempFile f("");
  EXPECT_EQ(error_of(f.path()),
            "--data " + f.path() + ": file is empty; give a non-empty UTF-8 text file");
}

TEST(CorpusTest, InvalidUtf8ReportsOffset) {
  TempFile f(std::string("abc\xC3\xA9") + "\xFF" + "def");
  const std::string err = error_of(f.path());
  EXPECT_NE(err.find("not valid UTF-8"), std::string::npos) << err;
  EXPECT_NE(err.find("at byte offset 5"), std::string::npos) << err;
}

TEST(CorpusTest, Utf8ValidatorRejectsMalformedSequences) {
  auto bad = [](const std::string& s) {
    return trireme::data::first_invalid_utf8(reinterpret_cast<const uint8_t*>(s.data()),
                                             s.size());
  };
  EXPECT_EQ(bad("plain ascii"), -1);
  EXPECT_EQ(bad("\xE2\x82\xAC \xF0\x9F\x98\x80"), -1);  // euro sign, emoji
  EXPECT_EQ(bad("a\x80"), 1);                           // stray continuation
  EXPECT_EQ(bad("ab\xC0\xAF"), 2);                      // overlong '/'
  EXPECT_EQ(bad("\xED\xA0\x80"), 0);                    // surrogate U+D800
  EXPECT_EQ(bad("\xF4\x90\x80\x80"), 0);                // above U+10FFFF
  EXPECT_EQ(bad("xyz\xE2\x82"), 3);                     // truncated at the end
}

TEST(CorpusTest, TooShortForSequenceLength) {
  const Corpus c = Corpus::from_bytes({'a', 'b', 'c'}, "short.txt");
  EXPECT_NO_THROW(c.require_length(2));
  try {
    c.require_length(3);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "--data short.txt: 3 bytes is too short for --seq 3; give a text of at "
                 "least 4 bytes or lower --seq");
  }
}

TEST(CorpusTest, DefaultCorpusIsBundledAndValid) {
  const Corpus c = Corpus::load(trireme::data::default_corpus_path());
  EXPECT_GT(c.size(), 1000000u);
  EXPECT_LE(c.size(), 2000000u);
}

TEST(CorpusTest, DefaultCorpusHonoursEnvironment) {
  ::setenv("TRIREME_CORPUS", "/some/where.txt", 1);
  EXPECT_EQ(trireme::data::default_corpus_path(), "/some/where.txt");
  ::unsetenv("TRIREME_CORPUS");
}
