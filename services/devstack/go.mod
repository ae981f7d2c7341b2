module github.com/razorbill/flo/services/devstack

go 1.26.0
