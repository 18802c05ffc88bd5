// The one bucketing rule (assign_buckets) and the Bucketer's in-order launch
// (dtrain/bucketer.h), without a transport.
#include "dtrain/bucketer.h"

#include <gtest/gtest.h>

#include <vector>

#include "dtrain/error.h"

namespace dtrain {
namespace {

using Buckets = std::vector<std::vector<size_t>>;

TEST(AssignBuckets, ReverseRegistrationOrderUpToTheCap) {
  // Sizes in bytes of tensors 0..4; backward produces 4 first.
  EXPECT_EQ(assign_buckets({40, 40, 40, 40, 40}, 100), (Buckets{{4, 3}, {2, 1}, {0}}));
  EXPECT_EQ(assign_buckets({40, 40, 40, 40, 40}, 120), (Buckets{{4, 3, 2}, {1, 0}}));
}

TEST(AssignBuckets, ATensorOverTheCapGetsABucketOfItsOwn) {
  EXPECT_EQ(assign_buckets({10, 500, 10, 10}, 100), (Buckets{{3, 2}, {1}, {0}}));
}

TEST(AssignBuckets, CapZeroIsOneTensorPerBucket) { EXPECT_EQ(assign_buckets({4, 4, 4}, 0), (Buckets{{2}, {1}, {0}})); }

TEST(AssignBuckets, EmptyTensorsJoinTheOpenBucketAndNoTensorsMeanNoBuckets) {
  EXPECT_EQ(assign_buckets({8, 0, 8}, 8), (Buckets{{2, 1}, {0}}));
  EXPECT_TRUE(assign_buckets({}, 64).empty());
}

struct Recorder : BucketReduction {
  std::vector<size_t> launched;
  void launch(size_t bucket) override { launched.push_back(bucket); }
};

TEST(Bucketer, LaunchesEachBucketOnceInBucketOrder) {
  Bucketer b({40, 40, 40, 40, 40}, 100);  // buckets {4,3} {2,1} {0}
  ASSERT_EQ(b.num_buckets(), 3u);
  EXPECT_EQ(b.bucket_of(1), 1u);
  EXPECT_EQ(b.position_of(1), 1u);
  Recorder r;
  // Bucket 1 completes first, but waits for bucket 0.
  EXPECT_TRUE(b.mark(2, r));
  EXPECT_TRUE(b.mark(1, r));
  EXPECT_TRUE(r.launched.empty());
  EXPECT_TRUE(b.mark(4, r));
  EXPECT_FALSE(b.mark(4, r));  // a second mark in the same step does nothing
  EXPECT_TRUE(r.launched.empty());
  EXPECT_TRUE(b.mark(3, r));
  EXPECT_EQ(r.launched, (std::vector<size_t>{0, 1}));
  EXPECT_FALSE(b.all_launched());
  EXPECT_TRUE(b.mark(0, r));
  EXPECT_EQ(r.launched, (std::vector<size_t>{0, 1, 2}));
  EXPECT_TRUE(b.all_launched());

  b.begin();  // the next step starts from nothing ready
  EXPECT_FALSE(b.ready(4));
  EXPECT_FALSE(b.all_launched());
  for (size_t i : {0, 1, 2, 3, 4}) b.mark(i, r);
  EXPECT_EQ(r.launched, (std::vector<size_t>{0, 1, 2, 0, 1, 2}));
}

TEST(Bucketer, ATensorOutOfRangeIsRefused) {
  Bucketer b({4, 4}, 8);
  Recorder r;
  EXPECT_THROW(b.mark(2, r), InvalidUsage);
}

}  // namespace
}  // namespace dtrain
