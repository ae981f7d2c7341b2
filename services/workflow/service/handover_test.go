package service_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Beside a dispatcher of the version before the outcomes topic, the
// workflow service is not ready and advances no run: that dispatcher would
// end tasks whose outcomes the service never reads. Runs still start, and
// their tasks run; once the earlier dispatcher left its group, the runs
// advance. (What such a dispatcher left in the task events is read by
// libs/kafka's TakeOverTaskOutcomes, tested there and with the registry.)
func TestNoRunAdvancesBesideAnEarlierDispatcher(t *testing.T) {
	t.Parallel()
	broker := harness.NewBroker(t)
	e := &env{dbURL: harness.NewDatabase(t), brokers: broker.Addrs()}
	e.dispatcher = startDispatcher(t, e.dbURL, e.brokers)
	// A dispatcher of the earlier version: franz-go's default client id. It
	// reads a topic of its own, so that it owns none of the commands.
	earlier, err := kafka.NewClient(config.Kafka{Brokers: e.brokers}, kgo.ConsumerGroup(kafka.DispatcherGroup), kgo.ConsumeTopics("earlier-dispatcher"))
	require.NoError(t, err)
	adm, err := kafka.NewClient(config.Kafka{Brokers: e.brokers})
	require.NoError(t, err)
	t.Cleanup(adm.Close)
	require.Eventually(t, func() bool {
		members, err := kafka.DispatcherMembers(t.Context(), kadm.NewClient(adm))
		return err == nil && len(members) == 2
	}, waitFor, tick)

	e.wf = startWorkflow(t, e.dbURL, e.brokers)
	readyz := func() (int, string) { return harness.HTTPGet(t, "http://"+e.wf.svc.HTTPAddr()+"/readyz") }
	require.Eventually(t, func() bool {
		code, body := readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for the dispatchers of an earlier version (1: ")
	}, waitFor, tick)

	ns := e.namespace(t)
	ran := make(chan string, 1)
	e.worker(t, ns, script{"step": func(task *flov1.TaskAssignment) reply {
		select {
		case ran <- task.GetTaskId():
		default:
		}
		return ok(`{"ok":true}`)
	}})
	e.create(t, ns, `kind: Workflow
name: one
version: "1"
start:
  run: "@actions/step"
  transitions:
    success: flo.Completed
`)
	id := e.start(t, ns, "one", `{}`, "")
	taskID := <-ran
	require.Eventually(t, func() bool {
		task, err := e.dispatcher.GetTask(t.Context(), &flov1.GetTaskRequest{Namespace: ns, TaskId: taskID})
		return err == nil && task.GetStatus() == flov1.TaskStatus_TASK_STATUS_COMPLETED
	}, waitFor, tick)
	require.Equal(t, flov1.RunStatus_RUN_STATUS_RUNNING, e.run(t, ns, id).GetStatus())

	earlier.Close()
	e.waitRun(t, ns, id, flov1.RunStatus_RUN_STATUS_COMPLETED)
	code, _ := readyz()
	require.Equal(t, http.StatusOK, code)
}
