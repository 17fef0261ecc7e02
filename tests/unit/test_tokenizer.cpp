// Byte tokenizer round trips, and Corpus loading errors (with temporary files).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
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
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  TempFile f("text");
  ::chmod(f.path().c_str(), 0);
  EXPECT_NE(error_of(f.path()).find("cannot read (Permission denied)"), std::string::npos);
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
