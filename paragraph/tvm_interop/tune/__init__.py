"""Tuning TVM's kernels with MetaSchedule (`metaschedule`): resumable, with progress."""
