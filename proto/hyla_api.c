/* hyla_api.c — the method table of hyla_api.h. Static data; keep it in the order of the
 * .proto files (tests/test_rpc_fuzz.c compares it with the generated service descriptors). */
#include "hyla_api.h"

#include <string.h>

const hyla_api_method hyla_api_methods[] = {
    {"/hyla.v1.Sessions/CreateSession", "hyla.v1.Sessions", "CreateSession", 0, 0,
     &hyla__v1__create_session_request__descriptor, &hyla__v1__session__descriptor, 0},
    {"/hyla.v1.Sessions/Append", "hyla.v1.Sessions", "Append", 1, 1,
     &hyla__v1__append_request__descriptor, &hyla__v1__append_progress__descriptor, 0},
    {"/hyla.v1.Sessions/Generate", "hyla.v1.Sessions", "Generate", 0, 1,
     &hyla__v1__generate_request__descriptor, &hyla__v1__generate_response__descriptor, 0},
    {"/hyla.v1.Sessions/Pause", "hyla.v1.Sessions", "Pause", 0, 0,
     &hyla__v1__pause_request__descriptor, &hyla__v1__pause_response__descriptor, 0},
    {"/hyla.v1.Sessions/Resume", "hyla.v1.Sessions", "Resume", 0, 0,
     &hyla__v1__resume_request__descriptor, &hyla__v1__session__descriptor, 0},
    {"/hyla.v1.Sessions/Migrate", "hyla.v1.Sessions", "Migrate", 0, 0,
     &hyla__v1__migrate_request__descriptor, &hyla__v1__migrate_response__descriptor, 0},
    {"/hyla.v1.Sessions/Fork", "hyla.v1.Sessions", "Fork", 0, 0,
     &hyla__v1__fork_request__descriptor, &hyla__v1__session__descriptor, 0},
    {"/hyla.v1.Sessions/GetSession", "hyla.v1.Sessions", "GetSession", 0, 0,
     &hyla__v1__get_session_request__descriptor, &hyla__v1__session__descriptor, 0},
    {"/hyla.v1.Sessions/ListSessions", "hyla.v1.Sessions", "ListSessions", 0, 0,
     &hyla__v1__list_sessions_request__descriptor, &hyla__v1__list_sessions_response__descriptor, 0},
    {"/hyla.v1.Sessions/DeleteSession", "hyla.v1.Sessions", "DeleteSession", 0, 0,
     &hyla__v1__delete_session_request__descriptor, &hyla__v1__delete_session_response__descriptor, 0},
    {"/hyla.v1.Sessions/ListSnapshots", "hyla.v1.Sessions", "ListSnapshots", 0, 0,
     &hyla__v1__list_snapshots_request__descriptor, &hyla__v1__list_snapshots_response__descriptor, 0},
    {"/hyla.v1.Sessions/ExportSession", "hyla.v1.Sessions", "ExportSession", 0, 1,
     &hyla__v1__export_session_request__descriptor, &hyla__v1__export_session_chunk__descriptor, 0},
    {"/hyla.v1.Sessions/ImportSession", "hyla.v1.Sessions", "ImportSession", 1, 0,
     &hyla__v1__import_session_request__descriptor, &hyla__v1__session__descriptor, 0},
    {"/hyla.v1.Sessions/ListModels", "hyla.v1.Sessions", "ListModels", 0, 0,
     &hyla__v1__list_models_request__descriptor, &hyla__v1__list_models_response__descriptor, 0},
    {"/hyla.v1.Sessions/ReadTokens", "hyla.v1.Sessions", "ReadTokens", 0, 0,
     &hyla__v1__read_tokens_request__descriptor, &hyla__v1__read_tokens_response__descriptor, 0},
    {"/hyla.v1.Cluster/ListWorkers", "hyla.v1.Cluster", "ListWorkers", 0, 0,
     &hyla__v1__list_workers_request__descriptor, &hyla__v1__list_workers_response__descriptor, 0},
    {"/hyla.v1.Cluster/ListClusterSessions", "hyla.v1.Cluster", "ListClusterSessions", 0, 0,
     &hyla__v1__list_cluster_sessions_request__descriptor, &hyla__v1__list_cluster_sessions_response__descriptor, 0},
    {"/hyla.v1.Cluster/DrainWorker", "hyla.v1.Cluster", "DrainWorker", 0, 0,
     &hyla__v1__drain_worker_request__descriptor, &hyla__v1__drain_worker_response__descriptor, 0},
    {"/hyla.v1.Coordinator/RegisterWorker", "hyla.v1.Coordinator", "RegisterWorker", 0, 0,
     &hyla__v1__register_worker_request__descriptor, &hyla__v1__register_worker_response__descriptor, 1},
    {"/hyla.v1.Coordinator/Heartbeat", "hyla.v1.Coordinator", "Heartbeat", 0, 0,
     &hyla__v1__heartbeat_request__descriptor, &hyla__v1__heartbeat_response__descriptor, 1},
    {"/hyla.v1.Coordinator/ReportSnapshot", "hyla.v1.Coordinator", "ReportSnapshot", 0, 0,
     &hyla__v1__report_snapshot_request__descriptor, &hyla__v1__report_snapshot_response__descriptor, 1},
    {"/hyla.v1.Worker/LoadSession", "hyla.v1.Worker", "LoadSession", 0, 0,
     &hyla__v1__load_session_request__descriptor, &hyla__v1__worker_session_response__descriptor, 1},
    {"/hyla.v1.Worker/Append", "hyla.v1.Worker", "Append", 1, 1,
     &hyla__v1__append_request__descriptor, &hyla__v1__append_progress__descriptor, 1},
    {"/hyla.v1.Worker/Generate", "hyla.v1.Worker", "Generate", 0, 1,
     &hyla__v1__generate_request__descriptor, &hyla__v1__generate_response__descriptor, 1},
    {"/hyla.v1.Worker/Snapshot", "hyla.v1.Worker", "Snapshot", 0, 0,
     &hyla__v1__snapshot_request__descriptor, &hyla__v1__snapshot_response__descriptor, 1},
    {"/hyla.v1.Worker/Unload", "hyla.v1.Worker", "Unload", 0, 0,
     &hyla__v1__unload_request__descriptor, &hyla__v1__unload_response__descriptor, 1},
    {"/hyla.v1.Worker/ForkSession", "hyla.v1.Worker", "ForkSession", 0, 0,
     &hyla__v1__fork_session_request__descriptor, &hyla__v1__worker_session_response__descriptor, 1},
    {"/hyla.v1.Worker/DescribeSession", "hyla.v1.Worker", "DescribeSession", 0, 0,
     &hyla__v1__describe_session_request__descriptor, &hyla__v1__worker_session_response__descriptor, 1},
    {"/hyla.v1.Worker/ReadTokens", "hyla.v1.Worker", "ReadTokens", 0, 0,
     &hyla__v1__read_tokens_request__descriptor, &hyla__v1__read_tokens_response__descriptor, 1},
    {"/hyla.v1.Worker/StageForward", "hyla.v1.Worker", "StageForward", 1, 1,
     &hyla__v1__stage_forward_request__descriptor, &hyla__v1__stage_forward_response__descriptor, 1},
    {"/hyla.v1.Worker/ExportStage", "hyla.v1.Worker", "ExportStage", 0, 1,
     &hyla__v1__export_stage_request__descriptor, &hyla__v1__get_snapshot_response__descriptor, 1},
    {"/hyla.v1.StateStore/PutSnapshot", "hyla.v1.StateStore", "PutSnapshot", 1, 0,
     &hyla__v1__put_snapshot_request__descriptor, &hyla__v1__put_snapshot_response__descriptor, 1},
    {"/hyla.v1.StateStore/GetSnapshot", "hyla.v1.StateStore", "GetSnapshot", 0, 1,
     &hyla__v1__get_snapshot_request__descriptor, &hyla__v1__get_snapshot_response__descriptor, 1},
    {"/hyla.v1.StateStore/DeleteSnapshots", "hyla.v1.StateStore", "DeleteSnapshots", 0, 0,
     &hyla__v1__delete_snapshots_request__descriptor, &hyla__v1__delete_snapshots_response__descriptor, 1},
    {"/hyla.v1.Admin/CreateKey", "hyla.v1.Admin", "CreateKey", 0, 0,
     &hyla__v1__create_key_request__descriptor, &hyla__v1__create_key_response__descriptor, 0},
    {"/hyla.v1.Admin/RevokeKey", "hyla.v1.Admin", "RevokeKey", 0, 0,
     &hyla__v1__revoke_key_request__descriptor, &hyla__v1__revoke_key_response__descriptor, 0},
    {"/hyla.v1.Admin/ListKeys", "hyla.v1.Admin", "ListKeys", 0, 0,
     &hyla__v1__list_keys_request__descriptor, &hyla__v1__list_keys_response__descriptor, 0},
    {NULL, NULL, NULL, 0, 0, NULL, NULL, 0},
};

const ProtobufCServiceDescriptor *const hyla_api_services[] = {
    &hyla__v1__sessions__descriptor,    &hyla__v1__cluster__descriptor,
    &hyla__v1__coordinator__descriptor, &hyla__v1__worker__descriptor,
    &hyla__v1__state_store__descriptor, &hyla__v1__admin__descriptor, NULL,
};

int hyla_api_method_count(void) {
    int n = 0;
    while (hyla_api_methods[n].path)
        n++;
    return n;
}

const hyla_api_method *hyla_api_find(const char *path) {
    if (!path)
        return NULL;
    for (const hyla_api_method *m = hyla_api_methods; m->path; m++)
        if (strcmp(m->path, path) == 0)
            return m;
    return NULL;
}
