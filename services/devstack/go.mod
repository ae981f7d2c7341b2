module github.com/razorbill/flo/services/devstack

go 1.26.0

require (
	github.com/razorbill/flo-go v0.0.0-00010101000000-000000000000
	github.com/razorbill/flo/libs v0.0.0-00010101000000-000000000000
	github.com/razorbill/flo/proto v0.0.0-00010101000000-000000000000
	github.com/razorbill/flo/services/dispatcher v0.0.0-00010101000000-000000000000
	github.com/razorbill/flo/services/gateway v0.0.0-00010101000000-000000000000
)

replace (
	github.com/razorbill/flo-go => ../../libs/sdk
	github.com/razorbill/flo/libs => ../../libs
	github.com/razorbill/flo/proto => ../../proto
	github.com/razorbill/flo/services/dispatcher => ../dispatcher
	github.com/razorbill/flo/services/gateway => ../gateway
)
