#pragma once

#include <vector>

#include <torch/torch.h>

#include "dtrain/communicator.h"

// Metrics across workers (Paddle's fleet.metrics): every worker calls the same
// function with its local value, in the same order, and gets the global one.
// They need init(); before it they throw InvalidUsage. With one worker they
// return the local value.
namespace dtrain::fleet::metrics {

double sum(double local);
double max(double local);
double min(double local);
// Sums every element across workers, in place (one collective for the vector).
void sum(std::vector<double>& values);
// Global accuracy: sum(correct) / sum(total) (0 when total is 0 everywhere).
double acc(double correct, double total);
// Bucketed AUC as Paddle's fleet.metrics.auc(stat_pos, stat_neg): bucket i
// counts the positives (negatives) whose predicted probability p has
// floor(p * buckets) == i. The buckets are summed across workers (in place),
// then the area under the ROC curve is computed from them (ties within a
// bucket count one half). 0.5 when either class is empty.
double auc(std::vector<double>& pos, std::vector<double>& neg);
// The local helper: AUC of already-summed buckets.
double auc_of_buckets(const std::vector<double>& pos, const std::vector<double>& neg);

// Semantic-segmentation scores of a num_classes x num_classes confusion
// matrix (row-major; row = label, column = prediction; pixels with the ignore
// label are not counted), as PaddleSeg computes them: IoU = TP / (TP + FP +
// FN) per class (0 for a class absent from labels and predictions), mIoU its
// mean over all classes, pixel accuracy = trace / total, Cohen's Kappa, and
// per-class precision, recall and Dice.
struct SegmentationScores {
  std::vector<double> class_iou, class_precision, class_recall, class_dice;
  double miou = 0, accuracy = 0, kappa = 0, mdice = 0;
  double pixels = 0;  // counted pixels
};
// The local helper: scores of an already-summed matrix. InvalidUsage when the
// matrix is not num_classes x num_classes.
SegmentationScores segmentation_scores(const std::vector<double>& confusion, int num_classes);
// Sums every worker's confusion matrix (in place, one collective) and scores it.
SegmentationScores confusion(std::vector<double>& confusion, int num_classes);
// Reduces a CPU tensor (float32, float64, int32 or int64) in place.
void all_reduce(::torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum);

}  // namespace dtrain::fleet::metrics
