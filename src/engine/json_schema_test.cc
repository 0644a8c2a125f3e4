#include "arbiter/engine/json_schema.h"
#include <gtest/gtest.h>
namespace arbiter { namespace {
TEST(JsonSchemaSmoke, Converts) { auto g = JsonSchemaToGbnf("{}"); ASSERT_TRUE(g.ok()) << g.status().ToString(); }
}}
