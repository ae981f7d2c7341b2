package workerstream

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRunQueueServesInOrderWhileItHoldsItems(t *testing.T) {
	t.Parallel()
	var q runQueue[int]
	release := make(chan struct{})
	var served []int
	q.init(2, func(n int) {
		<-release
		served = append(served, n)
	})
	never := make(chan struct{})

	require.True(t, q.put(1, never))
	require.True(t, q.put(2, never))
	require.True(t, q.put(3, never), "1 is being served, 2 and 3 fill the queue")

	full := make(chan struct{})
	put4 := make(chan bool)
	go func() { put4 <- q.put(4, full) }()
	close(full)
	require.False(t, <-put4, "a put waiting for room gives up when its done closes")

	put5 := make(chan bool)
	go func() { put5 <- q.put(5, never) }()
	release <- struct{}{}
	require.True(t, <-put5, "a put waits for room")
	close(release)
	q.close()
	require.Equal(t, []int{1, 2, 3, 5}, served, "close waits until everything queued is served")
	require.False(t, q.running, "the serving goroutine ended with the queue empty")
	require.Nil(t, q.items, "and the buffer was let go")
	require.False(t, q.put(6, never), "a closed queue takes nothing")
}

func TestRunQueueRestartsAfterRunningDry(t *testing.T) {
	t.Parallel()
	var q runQueue[int]
	served := make(chan int)
	q.init(1, func(n int) { served <- n })
	never := make(chan struct{})
	for i := range 3 {
		require.True(t, q.put(i, never))
		require.Equal(t, i, <-served)
	}
	q.close()
}
