"""The stateful ops a model may run: each reviewed to stay in this process's memory.

TensorFlow marks an op ``is_stateful`` in its OpDef when it has effects beyond its outputs
(variables, random state, queues, files, servers, ...). A stateless op may run (unless it is one
of the few stateless ops that still reach a file, listed in ``outside.OUTSIDE_OPS``); a stateful
op only when it is reviewed here. An op a newer TensorFlow adds is refused until someone reviews
it (tests/test_allowlist.py walks the registry). Ops that call library functions are listed
because their functions are scanned too, at any depth.
"""
from __future__ import annotations

from typing import Dict


def _reviewed(text: str, reason: str) -> Dict[str, str]:
    return {op: reason for op in text.split()}


# op → why it stays in the process's memory (one line each; groups share their reason)
REVIEWED: Dict[str, str] = {
    # variables: resources in this process; a SavedModel's are filled by the loader
    **_reviewed("VarHandleOp _VarHandlesOp VariableV2 Variable TemporaryVariable",
                "creates a variable in memory"),
    **_reviewed("ReadVariableOp _ReadVariablesOp ResourceGather ResourceGatherNd VariableShape "
                "VarIsInitializedOp", "reads a variable in memory"),
    **_reviewed("AssignVariableOp AssignAddVariableOp AssignSubVariableOp ResourceScatterAdd "
                "ResourceScatterSub ResourceScatterMul ResourceScatterDiv ResourceScatterMin "
                "ResourceScatterMax ResourceScatterUpdate ResourceScatterNdAdd "
                "ResourceScatterNdSub ResourceScatterNdMin ResourceScatterNdMax "
                "ResourceScatterNdUpdate ResourceStridedSliceAssign ResourceCountUpTo",
                "writes a variable in memory"),
    **_reviewed("DestroyResourceOp DisableCopyOnRead", "releases or marks a resource in memory"),
    **_reviewed("ResourceApplyGradientDescent ResourceApplyMomentum ResourceApplyKerasMomentum "
                "ResourceApplyAdam ResourceApplyAdamWithAmsgrad ResourceApplyAdaMax "
                "ResourceApplyAdagrad ResourceApplyAdagradV2 ResourceApplyAdagradDA "
                "ResourceApplyAdadelta ResourceApplyRMSProp ResourceApplyCenteredRMSProp "
                "ResourceApplyFtrl ResourceApplyFtrlV2 ResourceApplyAddSign ResourceApplyPowerSign "
                "ResourceApplyProximalAdagrad ResourceApplyProximalGradientDescent "
                "ResourceSparseApplyMomentum ResourceSparseApplyKerasMomentum "
                "ResourceSparseApplyAdagrad ResourceSparseApplyAdagradV2 "
                "ResourceSparseApplyAdagradDA ResourceSparseApplyAdadelta "
                "ResourceSparseApplyRMSProp ResourceSparseApplyCenteredRMSProp "
                "ResourceSparseApplyFtrl ResourceSparseApplyFtrlV2 "
                "ResourceSparseApplyProximalAdagrad ResourceSparseApplyProximalGradientDescent",
                "an optimizer step on variables in memory"),
    # random numbers: a generator's state in memory
    **_reviewed("RandomUniform RandomUniformInt RandomStandardNormal TruncatedNormal "
                "ParameterizedTruncatedNormal RandomGamma RandomPoisson RandomPoissonV2 "
                "RandomShuffle RandomCrop Multinomial NonDeterministicInts "
                "SampleDistortedBoundingBox SampleDistortedBoundingBoxV2 StatefulUniform "
                "StatefulUniformInt StatefulUniformFullInt StatefulStandardNormal "
                "StatefulStandardNormalV2 StatefulTruncatedNormal StatefulRandomBinomial "
                "RngReadAndSkip RngSkip StatelessRandomGetAlg AnonymousRandomSeedGenerator "
                "AnonymousSeedGenerator DummySeedGenerator DeleteRandomSeedGenerator "
                "DeleteSeedGenerator AllCandidateSampler LogUniformCandidateSampler "
                "UniformCandidateSampler LearnedUnigramCandidateSampler "
                "ThreadUnsafeUnigramCandidateSampler", "draws random numbers in memory"),
    # FixedUnigramCandidateSampler: only without a vocab_file (outside.CONDITIONAL_OPS)
    "FixedUnigramCandidateSampler": "draws random numbers in memory (a vocab_file is refused)",
    # checks and logging
    **_reviewed("Assert CheckNumerics CheckNumericsV2", "fails the run on a bad value"),
    "Print": "prints to stderr",
    "PrintV2": "prints to stderr or a log (a file:// output_stream is refused)",
    "Timestamp": "reads the clock",
    # lookup tables: filled from tensors, or from a SavedModel's own asset (proven per call)
    **_reviewed("HashTable HashTableV2 MutableHashTable MutableHashTableV2 "
                "MutableHashTableOfTensors MutableHashTableOfTensorsV2 MutableDenseHashTable "
                "MutableDenseHashTableV2 AnonymousHashTable AnonymousMutableHashTable "
                "AnonymousMutableHashTableOfTensors AnonymousMutableDenseHashTable",
                "creates a lookup table in memory"),
    **_reviewed("LookupTableFindV2 LookupTableSizeV2 LookupTableExportV2",
                "reads a lookup table in memory"),
    **_reviewed("LookupTableImportV2 LookupTableInsertV2 LookupTableRemoveV2 InitializeTableV2 "
                "InitializeTableFromDataset", "fills a lookup table from tensors in memory"),
    # functional control flow and calls: the bodies they run are scanned too
    **_reviewed("If While Case StatefulPartitionedCall", "runs library functions, scanned too"),
    **_reviewed("_Arg _Retval", "a function's argument or result"),
    # tf.data over in-graph data: the datasets' own ops are scanned (file datasets are refused)
    **_reviewed("Iterator IteratorV2 AnonymousIterator AnonymousIteratorV2 AnonymousIteratorV3 "
                "MakeIterator OneShotIterator IteratorGetNext IteratorGetNextSync "
                "IteratorGetNextAsOptional IteratorToStringHandle IteratorFromStringHandle "
                "IteratorFromStringHandleV2 DeleteIterator DatasetToSingleElement ReduceDataset",
                "iterates a dataset in memory"),
    **_reviewed("TensorDataset TensorSliceDataset SparseTensorSliceDataset RangeDataset "
                "ListDataset RandomDataset RandomDatasetV2 ExperimentalRandomDataset "
                "ShuffleDatasetV2 ShuffleDatasetV3 ShuffleAndRepeatDatasetV2 "
                "GlobalShuffleDataset GroupByReducerDataset ExperimentalGroupByReducerDataset "
                "GeneratorDataset AnonymousMemoryCache DeleteMemoryCache DummyMemoryCache "
                "DummyIterationCounter ThreadPoolDataset ThreadPoolHandle "
                "ExperimentalThreadPoolDataset ExperimentalThreadPoolHandle",
                "a dataset over tensors and functions in memory"),
    # queues and staging areas (TF1 input pipelines): buffers in memory
    **_reviewed("FIFOQueue FIFOQueueV2 PaddingFIFOQueue PaddingFIFOQueueV2 PriorityQueue "
                "PriorityQueueV2 RandomShuffleQueue RandomShuffleQueueV2 FakeQueue "
                "QueueEnqueueV2 QueueEnqueueManyV2 QueueDequeueV2 QueueDequeueManyV2 "
                "QueueDequeueUpToV2 QueueCloseV2 QueueIsClosedV2 QueueSizeV2 Stage Unstage "
                "StagePeek StageSize StageClear MapStage MapUnstage MapUnstageNoKey MapPeek "
                "MapSize MapIncompleteSize MapClear OrderedMapStage OrderedMapUnstage "
                "OrderedMapUnstageNoKey OrderedMapPeek OrderedMapSize OrderedMapIncompleteSize "
                "OrderedMapClear", "a queue or staging buffer in memory"),
    # tensor arrays, stacks, sparse-tensor maps, mutexes: containers in memory
    **_reviewed("TensorArray TensorArrayV2 TensorArrayV3 TensorArrayReadV3 TensorArrayWriteV3 "
                "TensorArrayGatherV3 TensorArrayScatterV3 TensorArrayConcatV3 "
                "TensorArraySplitV3 TensorArraySizeV3 TensorArrayCloseV3 TensorArrayGrad "
                "TensorArrayGradV2 TensorArrayGradV3 TensorArrayGradWithShape Stack StackV2 "
                "StackPushV2 StackPopV2 StackCloseV2 AddSparseToTensorsMap "
                "AddManySparseToTensorsMap TakeManySparseFromTensorsMap MutexV2 MutexLock "
                "ConsumeMutexLock", "a container in memory"),
    # plain computation TensorFlow marks stateful for scheduling reasons
    **_reviewed("Empty DeepCopy GuaranteeConst GraphDefVersion DeviceIndex "
                "IsTensorFloat32Enabled CudnnRNN CudnnRNNV2 CudnnRNNV3",
                "computes in memory (stateful only for scheduling)"),
}
