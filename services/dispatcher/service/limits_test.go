package service_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"

	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// testHugeError: a worker's error of 5 MiB, more than a record can carry,
// reaches the FAILED event capped, and the tasks behind it complete with
// their events published: the event flow does not stop.
func testHugeError(t *testing.T, e *env) {
	ns := e.namespace(t)
	e.register(t, ns, "loud", nil)
	id := e.invoke(t, ns, "loud", `{}`)
	a := e.claimOne(t, ns, "loud", 0)
	require.Empty(t, e.report(t, ns, failed(a, strings.Repeat("é", 5<<20/2), false, true)))
	evs := e.events.waitEvents(t, id, evCreated, evStarted, evFailed)
	require.LessOrEqual(t, len(evs[2].GetError()), taskevent.MaxTextBytes)
	require.True(t, strings.HasPrefix(evs[2].GetError(), "éé"))

	var later []string
	for range 5 {
		later = append(later, e.invoke(t, ns, "loud", `{}`))
	}
	var reports []*dispatcherv1.Report
	for len(reports) < len(later) {
		for _, a := range e.claim(t, ns, []string{"loud"}, 5, waitFor, 0) {
			reports = append(reports, completed(a, `{"ok":true}`, ""))
		}
	}
	require.Empty(t, e.report(t, ns, reports...))
	for _, id := range later {
		e.events.waitEvents(t, id, evCreated, evStarted, evCompleted)
	}
}
