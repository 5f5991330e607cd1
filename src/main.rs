fn main() {
    print!("{}", maintenance_crds::crd_yaml().unwrap());
}
