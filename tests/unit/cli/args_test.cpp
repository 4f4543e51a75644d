// The command-line option parser: where values come from (command line > environment > --config
// file > declared default), byte sizes with units, errors that name the option, and --help.
#include "tools/args.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "scoped_env.h"

namespace pagellm::cli {
namespace {

std::vector<OptionGroup> test_options() {
  return {
      {"Cache",
       {{"kv-cache-memory", "BYTES", "KV pool size", "0"},
        {"block-size", "TOKENS", "tokens a block", "16"},
        {"no-prefix-caching", "", "turn prefix caching off"}}},
      {"Server",
       {{"port", "PORT", "TCP port", "8000"},
        {"api-key", "KEY", "bearer token", std::nullopt, "none"},
        {"sweep-rate", "RATES", "rates", std::nullopt},
        {"service-name", "NAME", "trace service name", "pagellm", "", {"TEST_ARGS_OTEL_NAME"}}}}};
}

// Runs Args::parse on a command line given as strings.
Status parse(Args& a, std::vector<std::string> words) {
  words.insert(words.begin(), "test");
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return a.parse(static_cast<int>(argv.size()), argv.data());
}

// A config file in the test's temporary folder.
std::string write_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("pagellm_args_test_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(path) << text;
  return path.string();
}

TEST(Args, DeclaredDefaultsAreWhatGettersReturn) {
  Args a("serve", "", test_options());
  ASSERT_TRUE(parse(a, {}).ok());
  EXPECT_EQ(*a.get_int("port"), 8000);
  EXPECT_EQ(*a.get_bytes("kv-cache-memory"), 0);
  EXPECT_FALSE(a.has("port"));  // defaulted, not set
  EXPECT_FALSE(a.flag("no-prefix-caching"));
  EXPECT_FALSE(a.get("api-key").has_value());
  EXPECT_EQ(a.str("api-key"), "");
  EXPECT_FALSE(a.get_int("api-key").ok());  // no value and no default: an error naming it
  EXPECT_NE(a.get_int("api-key").status().message().find("--api-key"), std::string::npos);
}

TEST(Args, CommandLineWinsOverEnvironmentWhichWinsOverFile) {
  const std::string file =
      write_file("precedence.yaml", "port: 1111\nblock-size: 32\nkv_cache_memory: 1GiB\n");
  {
    Args a("serve", "", test_options());
    ScopedEnv env("PAGELLM_PORT", "2222");
    ScopedEnv env2("PAGELLM_BLOCK_SIZE", "64");
    ASSERT_TRUE(parse(a, {"--config", file, "--port", "3333"}).ok());
    EXPECT_EQ(*a.get_int("port"), 3333);                  // command line
    EXPECT_EQ(*a.get_int("block-size"), 64);              // environment over file
    EXPECT_EQ(*a.get_bytes("kv-cache-memory"), 1 << 30);  // file (underscores name the option)
    EXPECT_TRUE(a.has("kv-cache-memory"));
  }
  {
    // The file named by the environment.
    Args a("serve", "", test_options());
    ScopedEnv env("PAGELLM_CONFIG", file.c_str());
    ASSERT_TRUE(parse(a, {"--port=4444"}).ok());
    EXPECT_EQ(*a.get_int("port"), 4444);
    EXPECT_EQ(*a.get_int("block-size"), 32);
  }
}

TEST(Args, EnvironmentAliasesComeAfterTheOwnName) {
  Args a("serve", "", test_options());
  ScopedEnv alias("TEST_ARGS_OTEL_NAME", "from-alias");
  ASSERT_TRUE(parse(a, {}).ok());
  EXPECT_EQ(a.str("service-name"), "from-alias");
  Args b("serve", "", test_options());
  ScopedEnv own("PAGELLM_SERVICE_NAME", "from-own");
  ASSERT_TRUE(parse(b, {}).ok());
  EXPECT_EQ(b.str("service-name"), "from-own");
}

TEST(Args, JsonConfigListsAndSwitches) {
  const std::string file = write_file(
      "c.json", R"({"sweep-rate": [2, 8, "inf"], "no-prefix-caching": true, "api-key": "k"})");
  Args a("serve", "", test_options());
  ASSERT_TRUE(parse(a, {"--config", file}).ok());
  EXPECT_EQ(a.str("sweep-rate"), "2,8,inf");
  EXPECT_TRUE(a.flag("no-prefix-caching"));
  EXPECT_EQ(a.str("api-key"), "k");
  // The command line turns a file's switch off again.
  Args b("serve", "", test_options());
  ASSERT_TRUE(parse(b, {"--config", file, "--no-prefix-caching=false"}).ok());
  EXPECT_FALSE(b.flag("no-prefix-caching"));
}

TEST(Args, UnknownNamesAreErrorsWithTheClosestKnownOne) {
  Args a("serve", "", test_options());
  Status s = parse(a, {"--blok-size", "8"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown option --blok-size"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("did you mean --block-size?"), std::string::npos) << s.message();

  const std::string file = write_file("typo.yaml", "kv-cache-memry: 8GiB\n");
  Args b("serve", "", test_options());
  s = parse(b, {"--config", file});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown key 'kv-cache-memry'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("did you mean 'kv-cache-memory'?"), std::string::npos) << s.message();

  Args c("serve", "", test_options());
  s = parse(c, {"--zzzzzzzzzz"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().find("did you mean"), std::string::npos) << s.message();  // nothing near
}

TEST(Args, BadInputIsAClearError) {
  const auto fails_with = [](std::vector<std::string> words, const std::string& what) {
    Args a("serve", "", test_options());
    const Status s = parse(a, words);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  fails_with({"--port"}, "needs a value");
  fails_with({"--no-prefix-caching=maybe"}, "expects true or false");
  fails_with({"--config", "/nonexistent/pagellm.yaml"}, "cannot open");
  fails_with({"--config", write_file("list.yaml", "- port\n- 8000\n")}, "a map of option names");
  fails_with({"--config", write_file("bad.yaml", "port: [1\n")}, "not YAML or JSON");
  fails_with({"--config", write_file("map.yaml", "port: {a: 1}\n")},
             "'port' needs a value, not a map");
  fails_with({"--config", write_file("sw.yaml", "no-prefix-caching: sometimes\n")}, "in ");
  fails_with({"--config", write_file("nested.yaml", "config: other.yaml\n")},
             "unknown key 'config'");
  {
    ScopedEnv env("PAGELLM_NO_PREFIX_CACHING", "perhaps");
    fails_with({}, "environment variable PAGELLM_NO_PREFIX_CACHING");
  }
  Args a("serve", "", test_options());
  ASSERT_TRUE(parse(a, {"--port", "80x"}).ok());  // numbers are checked when read
  EXPECT_NE(a.get_int("port").status().message().find("--port expects an integer, got '80x'"),
            std::string::npos);
}

TEST(Args, EmptyConfigFileSetsNothing) {
  Args a("serve", "", test_options());
  ASSERT_TRUE(parse(a, {"--config", write_file("empty.yaml", "")}).ok());
  EXPECT_FALSE(a.has("port"));
}

TEST(Args, ByteSizesTakeUnits) {
  EXPECT_EQ(*parse_bytes("x", "1073741824"), 1073741824);
  EXPECT_EQ(*parse_bytes("x", "8GiB"), 8LL << 30);
  EXPECT_EQ(*parse_bytes("x", "8gib"), 8LL << 30);
  EXPECT_EQ(*parse_bytes("x", "8Gi"), 8LL << 30);
  EXPECT_EQ(*parse_bytes("x", "1.5GiB"), 3LL << 29);
  EXPECT_EQ(*parse_bytes("x", "512MB"), 512000000);
  EXPECT_EQ(*parse_bytes("x", "512M"), 512000000);
  EXPECT_EQ(*parse_bytes("x", "64KiB"), 65536);
  EXPECT_EQ(*parse_bytes("x", "2 TiB"), 2LL << 40);
  EXPECT_EQ(*parse_bytes("x", "100B"), 100);
  for (const char* bad : {"", "GiB", "8XB", "-1", "0.5", "1e3", "8GiBs", "99999999TiB"}) {
    auto r = parse_bytes("--kv-cache-memory", bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("--kv-cache-memory"), std::string::npos);
    }
  }
}

TEST(Args, IntLists) {
  Args a("generate", "", {{"Input", {{"prompt-ids", "IDS", "ids"}}}});
  ASSERT_TRUE(parse(a, {"--prompt-ids", "5,17,42"}).ok());
  EXPECT_EQ(*a.get_int_list("prompt-ids"), (std::vector<int32_t>{5, 17, 42}));
  Args b("generate", "", {{"Input", {{"prompt-ids", "IDS", "ids"}}}});
  ASSERT_TRUE(parse(b, {"--prompt-ids", "5,,42"}).ok());
  EXPECT_FALSE(b.get_int_list("prompt-ids").ok());
}

TEST(Args, HelpListsEveryOptionWithDefaultAndEnvironment) {
  Args a("serve", "The server.", test_options());
  ASSERT_TRUE(parse(a, {"-h"}).ok());
  EXPECT_TRUE(a.help_requested());
  const std::string h = a.help();
  EXPECT_EQ(h.rfind("usage: pagellm serve [options]", 0), 0u) << h;
  for (const OptionGroup& g : test_options()) {
    EXPECT_NE(h.find("\n" + g.title + ":\n"), std::string::npos) << g.title;
    for (const Option& o : g.options) {
      EXPECT_NE(h.find("--" + o.name), std::string::npos) << o.name;
      EXPECT_NE(h.find(Args::env_name(o.name)), std::string::npos) << o.name;
    }
  }
  EXPECT_NE(h.find("[default: 8000]"), std::string::npos);
  EXPECT_NE(h.find("[default: none]"), std::string::npos);
  EXPECT_NE(h.find("TEST_ARGS_OTEL_NAME"), std::string::npos);
  EXPECT_NE(h.find("--config FILE"), std::string::npos);
  for (size_t pos = 0, next; pos < h.size(); pos = next + 1) {
    next = h.find('\n', pos);
    if (next == std::string::npos) next = h.size();
    EXPECT_LE(next - pos, 100u) << h.substr(pos, next - pos);  // wrapped at 100 columns
  }
  // An unknown option is an error even beside --help.
  Args b("serve", "", test_options());
  EXPECT_FALSE(parse(b, {"--help", "--nope"}).ok());
}

}  // namespace
}  // namespace pagellm::cli
