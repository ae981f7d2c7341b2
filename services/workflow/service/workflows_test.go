package service_test

// The reference's two complete examples, as written there, and smaller
// definitions for the behaviours the tests pin down.

const processOrderYAML = `kind: Workflow
name: process-order
version: "1.0.0"
idempotency: required
start:
  run: "@actions/validate-order"
  transitions:
    success: charge
    failure: flo.Failed
steps:
  charge:
    run: "@actions/charge-payment"
    retry:
      max_attempts: 3
      backoff: exponential
      initial_delay_ms: 1000
      max_delay_ms: 30000
    transitions:
      success: ship
      failure: flo.Failed
  ship:
    run: "@actions/create-shipment"
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// orderProcessingYAML is the reference's "Order Processing with Signals";
// %d is the approval timeout in milliseconds (an hour in the reference).
const orderProcessingYAML = `kind: Workflow
name: order-processing
version: "1.0.0"
idempotency: required
terminals:
  OrderCompleted:
    status: completed
  OrderRejected:
    status: failed
  PaymentFailed:
    status: failed
start:
  run: "@actions/validate-order"
  transitions:
    success: process_payment
    failure: flo.Failed
steps:
  process_payment:
    run: "@actions/charge-payment"
    retry:
      max_attempts: 3
      backoff: exponential
      initial_delay_ms: 1000
    transitions:
      success: check_approval
      failure: PaymentFailed
  check_approval:
    run: "@actions/check-approval-needed"
    transitions:
      success: fulfill # no approval needed
      failure: await_approval # high-value order, needs approval
  await_approval:
    waitForSignal:
      type: approval
      timeoutMs: %d
      onTimeout: OrderRejected
    transitions:
      success: fulfill
  fulfill:
    run: "@actions/ship-order"
    inputMapping: '{"order": "$.input.order_id", "payment": "$.steps.process_payment.output.payment_id"}'
    transitions:
      success: OrderCompleted
      failure: flo.Failed
`

// threeStepYAML is three trivial actions in a row, named NAME.
const threeStepYAML = `kind: Workflow
name: %s
version: "1"
start:
  run: "@actions/step-a"
  transitions:
    success: b
    failure: flo.Failed
steps:
  b:
    run: "@actions/step-b"
    inputMapping: '{"from_a": "$.steps._start.output", "run": "$.flo.run_id"}'
    retry:
      max_attempts: 3
      backoff: constant
      initial_delay_ms: 100
    transitions:
      success: c
      failure: flo.Failed
  c:
    run: "@actions/step-c"
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// waitYAML waits for a "go" signal, named NAME with version VERSION.
const waitYAML = `kind: Workflow
name: %s
version: "%s"
idempotency: optional
start:
  waitForSignal:
    type: go
  transitions:
    success: flo.Completed
`
